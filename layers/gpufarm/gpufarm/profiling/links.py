"""Signed, expiring links to a run's summary page: `<base>/profiles/<key>?expires=<epoch>&sig=<hmac>`.

The page function serves a page only for a link whose signature (HMAC-SHA256 with the deployment's
`profile_link_secret`, a key of the gpufarm secret like the other secrets) covers the object key and the expiry,
and whose expiry has not passed, so a link in an incident or a dashboard iframe opens that one page for a while
and cannot be turned into another page's link. The key is checked for shape before anything is looked up.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from gpufarm.core.kernel.errors import NotAllowed, ValidationFailed

# A run's objects: profiles/ir-<n>/<run>-<stamp>/{trace.json.gz,summary.html}; links name the run's folder.
# `latest/<team>`: the newest run of a team's leases, which the project dashboard's iframe widgets show.
KEY = re.compile(r"^(ir-[1-9][0-9]{0,8}/[a-z0-9][a-z0-9_.-]{0,62}-[0-9]{8}t[0-9]{6}z|latest/[a-z0-9][a-z0-9_-]{0,62})$")
LATEST = "latest/"


@dataclass(frozen=True)
class LinkSigner:
    """Signs and checks page links with one secret."""

    secret: bytes

    def signature(self, key: str, expires: int) -> str:
        """The link's signature: HMAC-SHA256 over key and expiry, its first 128 bits in hex (a link must fit one
        history entry with the run's name; 128 bits are what a forger has to guess)."""
        return hmac.new(self.secret, f"{key}\n{expires}".encode(), hashlib.sha256).hexdigest()[:32]

    def link(self, base_url: str, key: str, expires: int) -> str:
        """The page's link, valid until `expires` (epoch seconds)."""
        checked_key(key)
        return f"{base_url.rstrip('/')}/profiles/{quote(key)}?expires={expires}&sig={self.signature(key, expires)}"

    def check(self, key: str, expires: str, sig: str, now: float) -> None:
        """Refuse (NotAllowed) a link that is not ours, is for another key, or has expired."""
        checked_key(key)
        if not expires.isascii() or not expires.isdigit() or len(expires) > 12:
            raise NotAllowed("this link is not valid")
        if not hmac.compare_digest(self.signature(key, int(expires)), sig.encode("ascii", "replace").decode()):
            raise NotAllowed("this link is not valid")
        if int(expires) < now:
            raise NotAllowed("this link has expired; open the run from the incident or the dashboard again")


def latest_key(team: str) -> str | None:
    """The key of a team's newest run (None for a team name that cannot be one)."""
    key = LATEST + team
    return key if KEY.match(key) else None


def latest_links(pages_url: str, signer: LinkSigner, teams: list[str], now: datetime) -> dict[str, str]:
    """Each team's newest-run link for the dashboard, valid to the start of the year after next.

    The expiry moves once a year, so a re-applied dashboard is unchanged (no drift) for a year at a time.
    """
    expires = int(datetime(now.year + 2, 1, 1, tzinfo=UTC).timestamp())
    out = {}
    for team in teams:
        key = latest_key(team)
        if key is not None:
            out[team] = signer.link(pages_url, key, expires)
    return out


def checked_key(key: str) -> str:
    """The run key, when it has gpufarm's shape (ValidationFailed otherwise)."""
    if not KEY.match(key):
        raise ValidationFailed("key", "not a profiler run")
    return key
