"""The project dashboard's newest-run links, from the deployment's settings (for `gpufarm datadog apply`).

None when the profile pages are not configured (no GPUFARM_PROFILE_PAGES_URL or no link secret): the
dashboard then has no iframes, and apply needs nothing of the profiler runs.
"""

from __future__ import annotations

from datetime import UTC, datetime

from gpufarm.config import Settings
from gpufarm.core.config.farm import FarmConfig
from gpufarm.profiling.links import LinkSigner, latest_links


def newest_run_links(settings: Settings, farm: FarmConfig, now: datetime | None = None) -> dict[str, str] | None:
    """Each team's signed newest-run link, or None without the profile pages."""
    secret = settings.profile_link_secret.get_secret_value() if settings.profile_link_secret else ""
    if not settings.profile_pages_url or not secret:
        return None
    signer = LinkSigner(secret.encode())
    return latest_links(settings.profile_pages_url, signer, sorted(farm.teams), now or datetime.now(UTC))
