"""Signed, expiring links to a run's summary page: `<base>/profiles/<key>?expires=<epoch>&sig=<hmac>`.

The page function serves a page only for a link whose signature (HMAC-SHA256 with the deployment's
`profile_link_secret`, a secret key of the deployment like the others) covers the object key and the expiry,
and whose expiry has not passed, so a link in an incident or a dashboard iframe opens that one page for a while
and cannot be turned into another page's link. The key is checked for shape before anything is looked up.

Two rules keep a leaked link or key short-lived:
- **A bound on every link's life** (GPUFARM_PROFILE_LINK_DAYS, default 30): a link whose expiry lies further than
  the bound from now is refused when it is checked, whatever its signature, so a link signed for longer (the
  two-year dashboard links of earlier releases, or one made with a stolen key) does not open. Run links are signed
  for the shorter of the runs' retention and the bound; the dashboards' `latest/<team>` links for the bound, in
  buckets (`latest_expiry`), and re-signed by `gpufarm datadog apply` and the scheduled sync before they expire.
- **Rotation**: `profile_link_secret` signs; `profile_link_secret_previous` is accepted too (outside a rotation it
  holds the link key itself), so links signed before a rotation keep opening until they are re-signed or the
  rotation is finished (`gpufarm secrets rotate-link-key`; docs/operate.md, "Rotating the link key").
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

from gpufarm.config import Settings
from gpufarm.core.kernel.errors import NotAllowed, ValidationFailed

# A run's objects: profiles/ir-<n>/<run>-<stamp>/{trace.json.gz,summary.html}; links name the run's folder.
# `latest/<team>`: the newest run of a team's leases, which the project dashboard's iframe widgets show.
KEY = re.compile(r"^(ir-[1-9][0-9]{0,8}/[a-z0-9][a-z0-9_.-]{0,62}-[0-9]{8}t[0-9]{6}z|latest/[a-z0-9][a-z0-9_-]{0,62})$")
LATEST = "latest/"
DAY_S = 86_400
DEFAULT_LINK_DAYS = 30
NOT_VALID = "this link is not valid"


def _sign(secret: bytes, key: str, expires: int) -> str:
    return hmac.new(secret, f"{key}\n{expires}".encode(), hashlib.sha256).hexdigest()[:32]


@dataclass(frozen=True)
class LinkSigner:
    """Signs page links with the current secret; checks them against it and, during a rotation, the previous one.

    `max_age_s` is the bound on a link's life: nothing is signed for longer, and a link whose expiry is further
    than that from now is refused.
    """

    secret: bytes
    previous: bytes | None = None
    max_age_s: int = DEFAULT_LINK_DAYS * DAY_S

    def signature(self, key: str, expires: int) -> str:
        """The link's signature: HMAC-SHA256 over key and expiry, its first 128 bits in hex (a link must fit one
        history entry with the run's name; 128 bits are what a forger has to guess)."""
        return _sign(self.secret, key, expires)

    def signed_now(self, key: str, expires: int, sig: str) -> bool:
        """True when `sig` is the current key's signature (False for the previous key's: due for re-signing)."""
        return hmac.compare_digest(self.signature(key, expires), sig.encode("ascii", "replace").decode())

    def expiry(self, now: float, wanted_s: int) -> int:
        """The expiry of a link made at `now` that should live `wanted_s` seconds, cut to the bound."""
        return int(now) + max(0, min(wanted_s, self.max_age_s))

    def link(self, base_url: str, key: str, expires: int) -> str:
        """The page's link, valid until `expires` (epoch seconds)."""
        checked_key(key)
        return f"{base_url.rstrip('/')}/profiles/{quote(key)}?expires={expires}&sig={self.signature(key, expires)}"

    def check(self, key: str, expires: str, sig: str, now: float) -> None:
        """Refuse (NotAllowed) a link that is not ours, is for another key, has expired, or claims a life longer
        than the bound (signed before the bound, or with a stolen key: either way not to be trusted)."""
        checked_key(key)
        if not expires.isascii() or not expires.isdigit() or len(expires) > 12:
            raise NotAllowed(NOT_VALID)
        sent = sig.encode("ascii", "replace").decode()
        keys = [self.secret] if self.previous is None else [self.secret, self.previous]
        # Every key is compared (no early exit), so the time taken does not say which one matched.
        matched = [hmac.compare_digest(_sign(secret, key, int(expires)), sent) for secret in keys]
        if not any(matched):
            raise NotAllowed(NOT_VALID)
        if int(expires) < now:
            raise NotAllowed("this link has expired; open the run from the incident or the dashboard again")
        if int(expires) - now > self.max_age_s:
            raise NotAllowed(NOT_VALID)


def link_signer(settings: Settings) -> LinkSigner:
    """The deployment's signer: its link key (ConfigurationMissing without one) and the bound on a link's life. It
    signs, and tells a link of the link key from another (the sync's re-signing); it accepts no other key, so what
    signs never reads `profile_link_secret_previous` (link_checker does)."""
    return LinkSigner(settings.require("profile_link_secret").encode(), None, settings.profile_link_days * DAY_S)


def link_checker(settings: Settings) -> LinkSigner:
    """What the pages check a link with: the link key and `profile_link_secret_previous` (during a rotation the
    key before it; otherwise the link key itself), each accepted, and the bound on a link's life."""
    previous = settings.profile_link_secret_previous
    return LinkSigner(
        settings.require("profile_link_secret").encode(),
        previous.get_secret_value().encode() if previous is not None and previous.get_secret_value() else None,
        settings.profile_link_days * DAY_S,
    )


def latest_key(team: str) -> str | None:
    """The key of a team's newest run (None for a team name that cannot be one)."""
    key = LATEST + team
    return key if KEY.match(key) else None


def latest_expiry(now: float, max_age_s: int) -> int:
    """The expiry of the dashboards' newest-run links signed at `now`: the next boundary of a half-bound bucket,
    plus half the bound.

    So a link lives between half the bound and the whole bound, never longer, and the expiry (and with it the
    dashboard) changes once per bucket, not on every apply or sync: `needs_resigning` re-signs when a quarter of
    the bound is left, which is always in a later bucket, so the new links are a bucket longer.
    """
    half = max(1, max_age_s // 2)
    return (int(now) // half + 1) * half + half


def needs_resigning(signer: LinkSigner, key: str, expires: int, sig: str, now: float) -> bool:
    """True when a dashboard link should be signed again now: it expires within a quarter of the bound, it claims
    more than the bound, or it is not the current key's (a rotation, or an edit)."""
    left = expires - now
    return left < signer.max_age_s / 4 or left > signer.max_age_s or not signer.signed_now(key, expires, sig)


def latest_links(pages_url: str, signer: LinkSigner, teams: list[str], now: datetime) -> dict[str, str]:
    """Each team's newest-run link for the dashboard, valid for the bound in buckets (`latest_expiry`)."""
    expires = latest_expiry(now.timestamp(), signer.max_age_s)
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
