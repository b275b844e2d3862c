"""The farm YAML's `digest:` section: when the operators' daily digest is posted and what counts as pressure.

`time` and `timezone` say when (local time, so 08:00 stays 08:00 across daylight saving); the digest function
runs every DIGEST_TICK_MINUTES and posts on the first run at or after that time (gpufarm.core.digest.run), so the
farm file alone decides the hour, without redeploying the schedule. `horizon_hours` is how far ahead the digest
looks for leases and exemptions ending; `quota_percent` and `budget_percent` are the shares of a quota or a
GPU-hour budget from which a team's use is shown as pressure.
"""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The digest function's schedule in template.yaml (cron every quarter hour): a digest time is posted at most
# this late, and every timezone's offset (whole, half and quarter hours) lands on a tick.
DIGEST_TICK_MINUTES = 15
_TIME_RE = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


class DigestSettings(BaseModel):
    """When the digest is posted (local time in a timezone) and the thresholds of its pressure lines."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    time: str = "08:00"
    timezone: str = "UTC"
    horizon_hours: int = Field(default=24, ge=1, le=24 * 7)
    quota_percent: float = Field(default=90.0, gt=0, le=100)
    budget_percent: float = Field(default=80.0, gt=0, le=100)

    @field_validator("time")
    @classmethod
    def _time(cls, value: str) -> str:
        if not _TIME_RE.match(value.strip()):
            raise ValueError("use HH:MM, 24-hour (e.g. 08:00)")
        return value.strip()

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        name = value.strip()
        # IANA names only (Europe/Berlin, UTC): no paths, bounded, and known to this Python's zone database.
        if not name or len(name) > 64 or ".." in name or name.startswith("/"):
            raise ValueError("use an IANA timezone name such as UTC or Europe/Berlin")
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"'{name}' is not a known IANA timezone") from None
        return name

    def local_time(self) -> dt.time:
        """The digest's time of day."""
        hours, minutes = self.time.split(":")
        return dt.time(int(hours), int(minutes))

    def zone(self) -> ZoneInfo:
        """The digest's timezone."""
        return ZoneInfo(self.timezone)
