"""Shuffled redelivery on `gpufarm local`: every incident webhook and idle alert arrives 2-3 times, out of order.

The fault day's waves (gpufarm_sandbox.badday, faults off) are played twice on a fresh sandbox each: once as
delivered, and once with every incident webhook Datadog delivered and every idle alert re-sent one or two more
times, in a shuffled order, at each point the scenario settles; each redelivery round first moves the sandbox
clock past SQS's five-minute deduplication window, so the copies reach the handlers rather than being dropped by
the queue (a late Triggered arriving after its Recovered, an "approved" webhook after the reclaim). The final
state of the two runs (every request's incident fields and every host's tags) must be identical: handlers read
the incident fresh, and an incident command already applied is recognised by its id in the incident
(gpufarm.core.commands.record), so a copy changes nothing. tests/hardening/test_redelivery.py runs it CI-sized;
benchmarks/reliability.py at full size.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from gpufarm_sandbox.badday import ALLOC_TAG_KEYS, BadDay
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.example_farm import HOSTS

# Past SQS FIFO's five-minute deduplication window (and well inside the idle grace of an hour).
PAST_DEDUP_S = 301
REDACTED = "***"
# A copy is sent in the round its original arrived in, or up to this many settling rounds later.
LATEST_ROUND = 3


@dataclass
class Redelivery:
    """What the redelivered run did and how its end compared with the in-order run's."""

    requests: int = 0
    webhooks: int = 0
    webhook_copies: int = 0
    alerts: int = 0
    alert_copies: int = 0
    differences: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def identical(self) -> bool:
        """True when the final states matched."""
        return not self.differences


class Redelivered(BadDay):
    """The fault day without faults, every incident webhook and idle alert delivered 2-3 times, shuffled."""

    def __init__(self, farm: LocalFarm, *, seed: int = 9) -> None:
        super().__init__(farm, rate=0.0)
        self.rng = random.Random(seed)  # noqa: S311 - a repeatable shuffle, not a secret
        self.secret = farm.host.env["GPUFARM_WEBHOOK_SECRET"]
        self.webhook_path = urlsplit(farm.host.env["GPUFARM_INCIDENT_WEBHOOK_URL"]).path
        self.seen: set[int] = set()
        self.alerts: list[dict[str, str]] = []
        self.stats = Redelivery()
        self.round = 0
        self.pending: list[tuple[int, Callable[[], Any]]] = []
        self._redelivering = False

    def send_alert(self, body: dict[str, str]) -> None:
        """Send the alert, and keep it to be sent again."""
        super().send_alert(body)
        self.alerts.append(body)
        self.stats.alerts += 1

    def settle(self, timeout: float = 120.0) -> None:
        """Settle, then send the copies now due (shuffled), and settle again.

        Each webhook delivered since the last round gets one or two copies, each due this round or up to
        LATEST_ROUND rounds later, so a copy may arrive after deliveries that followed its original; each idle
        alert gets one copy next round and perhaps a second (`_alert_copies`).
        """
        super().settle(timeout)
        if self._redelivering:
            return
        self.round += 1
        self.pending += [(self.round + self.rng.randint(0, LATEST_ROUND), send) for send in self._webhook_copies()]
        self.pending += self._alert_copies()
        self._send([send for when, send in self.pending if when <= self.round], timeout)
        self.pending = [(when, send) for when, send in self.pending if when > self.round]

    def before_the_last_sync(self) -> None:
        """Send every copy still pending."""
        self._send([send for _, send in self.pending], 120.0)
        self.pending = []

    def _send(self, copies: list[Callable[[], Any]], timeout: float) -> None:
        if not copies:
            return
        self._redelivering = True
        try:
            self.rng.shuffle(copies)
            self.farm.post("/_sandbox/clock", {"advance": PAST_DEDUP_S})
            for send in copies:
                send()
            super().settle(timeout)
        finally:
            self._redelivering = False

    def _webhook_copies(self) -> list[Callable[[], Any]]:
        new = [
            d
            for d in self.farm.get("/_sandbox/webhooks/deliveries")["deliveries"]
            if d.get("ok")
            and d.get("final")
            and d.get("delivery_id") not in self.seen
            and urlsplit(d.get("url") or "").path == self.webhook_path
        ]
        copies: list[Callable[[], Any]] = []
        for d in new:
            self.seen.add(d["delivery_id"])
            self.stats.webhooks += 1
            headers = {k: v.replace(REDACTED, self.secret) for k, v in (d.get("headers") or {}).items()}
            payload = (d.get("payload") or "").encode()
            for _ in range(self.rng.randint(1, 2)):
                copies.append(partial(_post, d["url"], payload, headers))
                self.stats.webhook_copies += 1
        return copies

    def _alert_copies(self) -> list[tuple[int, Callable[[], Any]]]:
        """One copy of each alert due next round, after the alert that followed it (a Triggered arriving after
        its Recovered: SQS no longer dedups it, only the incident's record of applied commands does), and half of
        them a second copy at a random round."""
        sent, self.alerts = self.alerts, []
        copies: list[tuple[int, Callable[[], Any]]] = []
        for body in sent:
            send = partial(BadDay.send_alert, self, body)
            copies.append((self.round + 1, send))
            if self.rng.random() < 0.5:
                copies.append((self.round + self.rng.randint(0, LATEST_ROUND), send))
        self.stats.alert_copies += len(copies)
        return copies


def final_state(farm: LocalFarm) -> dict[str, Any]:
    """Every gpufarm incident's fields that say what happened (by project) and every host's gpufarm tags."""
    incidents: dict[str, list[dict[str, Any]]] = {}
    for a in sorted(farm.incidents(), key=lambda a: a.ir):
        incidents.setdefault(a.project or "", []).append(
            {
                "state": a.state.value,
                "phase": a.phase.value,
                "reclaim_reason": a.reclaim_reason.value if a.reclaim_reason else None,
                "approved_by": a.approved_by,
                "duration_days": a.duration_days,
                "idle_warned": a.idle_warned_at is not None,
                "hosts": list(a.hosts),
                "host_gpus": dict(a.host_gpus),
                "title": a.title.replace(a.ir_label, "IR-n"),
            }
        )
    tags = {h[0]: sorted(t for t in farm.user_tags(h[0]) if t.split(":", 1)[0] in ALLOC_TAG_KEYS) for h in HOSTS}
    return {"incidents": incidents, "tags": tags}


def compare(in_order: dict[str, Any], redelivered: dict[str, Any]) -> list[str]:
    """Where two final states differ (empty when identical)."""
    out = []
    for key in sorted(set(in_order["incidents"]) | set(redelivered["incidents"])):
        one, two = in_order["incidents"].get(key), redelivered["incidents"].get(key)
        if one != two:
            out.append(f"{key}: in order {json.dumps(one)}; redelivered {json.dumps(two)}")
    out += [
        f"{host}: in order {tags}; redelivered {redelivered['tags'].get(host)}"
        for host, tags in sorted(in_order["tags"].items())
        if tags != redelivered["tags"].get(host)
    ]
    return out


def run(first: LocalFarm, fresh: Callable[[], LocalFarm], requests: int) -> Redelivery:
    """Play `requests` requests in order on `first`, then redelivered on `fresh()` (closed here), and compare."""
    start = time.monotonic()
    BadDay(first, rate=0.0).run(requests)
    in_order = final_state(first)
    second = fresh()
    try:
        day = Redelivered(second)
        day.run(requests)
        stats = day.stats
        stats.requests = len(day.requests)
        stats.differences = compare(in_order, final_state(second))
    finally:
        second.close()
    stats.seconds = time.monotonic() - start
    return stats


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)  # noqa: S310 - the local host
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
