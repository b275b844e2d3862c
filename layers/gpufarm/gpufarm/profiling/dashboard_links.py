"""The project dashboard's newest-run links, from the deployment's settings: signed by `gpufarm datadog apply`, and
re-signed by the scheduled sync before they expire (`resigned`).

None when the profile pages are not configured (no GPUFARM_PROFILE_PAGES_URL or no link secret): the
dashboard then has no iframes, and apply needs nothing of the profiler runs.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from gpufarm.config import Settings
from gpufarm.core.config.farm import FarmConfig
from gpufarm.profiling.links import KEY, LATEST, LinkSigner, latest_expiry, latest_links, link_signer, needs_resigning

# The keys of a dashboard that gpufarm writes (gpufarm.setup.dashboards.COMPARED); Datadog's own (id, url, author,
# dates) are not sent back.
WRITTEN = ("title", "description", "layout_type", "reflow_type", "template_variables", "widgets")


def newest_run_links(settings: Settings, farm: FarmConfig, now: datetime | None = None) -> dict[str, str] | None:
    """Each team's signed newest-run link, or None without the profile pages."""
    secret = settings.profile_link_secret.get_secret_value() if settings.profile_link_secret else ""
    if not settings.profile_pages_url or not secret:
        return None
    return latest_links(settings.profile_pages_url, link_signer(settings), sorted(farm.teams), now or datetime.now(UTC))


def resigned(dashboard: Mapping[str, Any], signer: LinkSigner, pages_url: str, now: float) -> dict[str, Any] | None:
    """The dashboard to write back with every newest-run iframe signed again, or None when none needs it yet.

    A link is due when it expires within a quarter of the bound, claims more than the bound, or is not signed
    with the current key (links.needs_resigning); then all of them get the same new expiry, as apply signs them.
    Iframes showing anything else are left as they are.
    """
    body = {name: copy.deepcopy(dashboard[name]) for name in WRITTEN if dashboard.get(name) is not None}
    iframes = list(_latest_iframes(body, pages_url))
    if not any(needs_resigning(signer, key, expires, sig, now) for _, key, expires, sig in iframes):
        return None
    expires = latest_expiry(now, signer.max_age_s)
    for widget, key, _, _ in iframes:
        widget["definition"]["url"] = signer.link(pages_url, key, expires)
    return body


def _latest_iframes(dashboard: Mapping[str, Any], pages_url: str) -> Iterator[tuple[dict[str, Any], str, int, str]]:
    """Each iframe widget showing a team's newest run under `pages_url`, with its key, expiry and signature."""
    prefix = f"{pages_url.rstrip('/')}/profiles/"
    for widget in _iframes(dashboard.get("widgets") or []):
        url = str(widget["definition"].get("url") or "")
        if not url.startswith(prefix + LATEST):
            continue
        key = unquote(url[len(prefix) :].split("?", 1)[0])
        if not KEY.match(key):
            continue
        query = parse_qs(urlsplit(url).query)
        expires = (query.get("expires") or [""])[0]
        # An expiry that is not a number counts as already expired: the link is due for signing.
        when = int(expires) if expires.isascii() and expires.isdigit() and len(expires) <= 12 else 0
        yield widget, key, when, (query.get("sig") or [""])[0]


def _iframes(widgets: Any) -> Iterator[dict[str, Any]]:
    """Every iframe widget, those inside groups too."""
    for widget in widgets if isinstance(widgets, list) else []:
        definition = widget.get("definition") if isinstance(widget, dict) else None
        if not isinstance(definition, dict):
            continue
        if definition.get("type") == "iframe":
            yield widget
        yield from _iframes(definition.get("widgets"))
