"""The secret keys line: which of the deployment's secrets `<prefix>/<key>` exist (one Secrets Manager secret per
key, each function granted only its own; docs/security.md). Doctor reads them as the functions do, through
Parameter Store, with the settings it loads: a key it may not read is named by that error instead."""

from __future__ import annotations

from collections.abc import Mapping

from gpufarm.config import SECRET_KEYS, secret_name
from gpufarm.setup.doctor.report import Line, Status
from gpufarm.setup.secrets import LINK, PREVIOUS, rotating

SECRET_KEYS_CHECK = "secret keys"  # noqa: S105 - the check's name, not a secret
# Every deployment's functions need these; the profile keys only profiler runs.
REQUIRED = ("datadog_api_key", "datadog_app_key", "slack_bot_token", "slack_signing_secret", "webhook_secret")
PUT = "`gpufarm secrets put --from-file <document>`"


def secret_keys_line(prefix: str, found: Mapping[str, str]) -> Line:
    """The line for the keys `found` (key -> value) under `prefix`: broken when a key every deployment needs is
    missing, fell back when the previous link key is (the functions that read it then ask once per key)."""
    missing = [k for k in REQUIRED if k not in found]
    if missing:
        names = ", ".join(secret_name(prefix, k) for k in missing)
        return Line(SECRET_KEYS_CHECK, Status.BROKEN, f"missing {names}: write them with {PUT}")
    if LINK in found and PREVIOUS not in found:
        return Line(
            SECRET_KEYS_CHECK,
            Status.FELL_BACK,
            f"no {secret_name(prefix, PREVIOUS)}: the pages function reads its keys one call per key at each cold "
            "start; `gpufarm secrets rotate-link-key --finish` writes it",
        )
    notes = []
    absent = [k for k in (LINK, "upload_token_secret") if k not in found]
    if absent:
        notes.append(f"no {', '.join(absent)} (profiler runs need them)")
    if rotating(found.get(LINK), found.get(PREVIOUS)):
        notes.append("a rotation of the link key is under way (`gpufarm secrets rotate-link-key --finish` ends it)")
    have = sum(1 for k in SECRET_KEYS if k in found)
    detail = f"{have} of {len(SECRET_KEYS)} keys under {prefix}/" + (f"; {'; '.join(notes)}" if notes else "")
    return Line(SECRET_KEYS_CHECK, Status.CONFIRMED, detail)
