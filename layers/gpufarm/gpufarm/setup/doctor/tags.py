"""Check 5: a tag written to a host the operator names, read back through the tags API and through the host
list's `tags_by_source`, then removed (exactly that tag: the host's other tags are written back as they were).

The host list spells the source key `user` on the main path; gpufarm's reads match it case-insensitively, so a
key spelled otherwise (`User`) is what they fall back to (the host list is read here as Datadog spells it). Pick a
host no lease is being allocated on while doctor runs: removing the tag rewrites the host's `user` tags, and a tag
another writer added in that instant is lost.
"""

from __future__ import annotations

import secrets

from gpufarm.core.kernel.ports import HostTags
from gpufarm.setup.doctor.ports import POLL_S, HostSources, Timing
from gpufarm.setup.doctor.report import Line, Status
from gpufarm.setup.doctor.scratch import Scratch

HOST_TAGS = "host tags"
TAG_KEY = "gpufarm_doctor"
SOURCE = "user"


def check_tags(hosts: HostSources, host: str | None, timing: Timing, scratch: Scratch) -> Line:
    """The tag line: confirmed, fell back (the host list spells the source another way) or broken."""
    if not host:
        return Line(HOST_TAGS, Status.SKIPPED, "no --host: name a host Datadog lists to write and read back a tag")
    if hosts.listed_sources(host) is None:
        return Line(HOST_TAGS, Status.BROKEN, f"Datadog lists no host named {host!r}; nothing was written")
    tag = f"{TAG_KEY}:{secrets.token_hex(6)}"
    with scratch.kept(f"tag {tag} on {host}", lambda: remove_tag(hosts, host, tag)):
        hosts.add_tags(host, [tag], source=SOURCE)
        if tag not in hosts.get_tags(host, source=SOURCE):
            return Line(HOST_TAGS, Status.BROKEN, f"{tag} was written to {host} but the tags API does not read it back")
        key = _await_listed(hosts, host, tag, timing)
    if key is None:
        return Line(HOST_TAGS, Status.BROKEN, f"the host list did not show {tag} on {host} within {timing.wait_s:g} s")
    if key == SOURCE:
        return Line(HOST_TAGS, Status.CONFIRMED, f"written, read back and listed under source {SOURCE!r} on {host}")
    if key.lower() == SOURCE:
        return Line(HOST_TAGS, Status.FELL_BACK, f"the host list names the source {key!r}, not {SOURCE!r}")
    return Line(HOST_TAGS, Status.BROKEN, f"the host list shows the tag under source {key!r}")


def _await_listed(hosts: HostSources, host: str, tag: str, timing: Timing) -> str | None:
    """The source key the host list shows the tag under, once it does; None after the bound."""
    until = timing.clock() + timing.wait_s
    while True:
        found = [key for key, tags in (hosts.listed_sources(host) or {}).items() if tag in tags]
        if found:
            # The main path's spelling wins when both appear.
            return SOURCE if SOURCE in found else found[0]
        left = until - timing.clock()
        if left <= 0:
            return None
        timing.sleep(min(POLL_S * 2, left))


def remove_tag(hosts: HostTags, host: str, tag: str) -> None:
    """Remove exactly `tag` from the host's user tags (nothing when it is not there)."""
    current = hosts.get_tags(host, source=SOURCE)
    if tag in current:
        hosts.replace_tags(host, [t for t in current if t != tag], source=SOURCE)
