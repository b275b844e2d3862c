"""A reservation asked in chat, made into a request with a window: the request's fields as `/gpu request` takes
them, the window from `from <date> <time> for <length>` (gpufarm.core.chat.reserve_text)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta

from gpufarm.core.chat.reserve_text import FOR_KEY, FROM_KEY, parse_length, parse_start
from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.model import GpuRequest


def build_reservation(
    values: Mapping[str, str | None], farm: FarmConfig, *, requester: str, channel: str | None, request_id: str
) -> GpuRequest:
    """The validated request of a booking; ValidationFailed names the first bad field."""
    start_text, length_text = values.get(FROM_KEY), values.get(FOR_KEY)
    if not start_text or not length_text:
        raise ValidationFailed("reserved_from", "a reservation names its start and its length")
    start, length = parse_start(start_text), parse_length(length_text)
    if "duration_days" in values:
        raise ValidationFailed("duration_days", "a reservation's length is its `for`, not days=")
    days = max(1, math.ceil(length / timedelta(days=1)))
    plain = {k: v for k, v in values.items() if k not in (FROM_KEY, FOR_KEY)}
    request = build_request(
        {**plain, "duration_days": str(days)}, farm, requester=requester, channel=channel, request_id=request_id
    )
    return request.model_copy(update={"reserved_from": start, "reserved_until": start + length})
