"""Running every check in order, each line handed out as soon as it is known.

The keys come first and alone: when they are wrong the run stops there, with one line, before anything is
written. Every later check runs even when one before it is broken (each says what it found); an error inside a
check makes that check's line broken. Scratch objects are removed when the check that made them ends, and once more
at the end of the run for anything left registered (gpufarm.setup.doctor.scratch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.setup.doctor.chat import check_slack
from gpufarm.setup.doctor.keys import KEYS, check_keys
from gpufarm.setup.doctor.objects import (
    INCIDENT_TYPE,
    MONITORS,
    SEARCHES,
    check_incident_type,
    check_monitors,
    check_searches,
)
from gpufarm.setup.doctor.ports import Collaborators, Options, Timing
from gpufarm.setup.doctor.report import Line, Status
from gpufarm.setup.doctor.roundtrip import ROUND_TRIP, check_round_trip, preflight, probe_incident, probe_pool
from gpufarm.setup.doctor.scratch import Scratch
from gpufarm.setup.doctor.tags import HOST_TAGS, check_tags
from gpufarm.setup.doctor.urls import IDLE, INCIDENT, INGRESS, PAGES, UPLOAD, check_urls
from gpufarm.setup.webhooks import IDLE_WEBHOOK, INCIDENT_WEBHOOK

log = logging.getLogger(__name__)

Emit = Callable[[Line], None]


class _Run:
    """One run's lines, handed to `emit` as they come, and its scratch objects."""

    def __init__(self, collaborators: Collaborators, options: Options, emit: Emit, timing: Timing) -> None:
        self.c = collaborators
        self.o = options
        self.emit = emit
        self.timing = timing
        self.lines: list[Line] = []
        self.scratch = Scratch()

    def say(self, lines: Sequence[Line]) -> None:
        for line in [*lines, *self.scratch.left]:
            self.lines.append(line)
            self.emit(line)
        self.scratch.left.clear()

    def step(self, check: str, run: Callable[[], Sequence[Line]]) -> None:
        """Run one check; an error inside it becomes its broken line."""
        try:
            lines = run()
        except GpufarmError as exc:
            lines = [Line(check, Status.BROKEN, str(exc))]
        except Exception as exc:
            # Whatever went wrong is this check's finding; the checks after it still run, and the traceback is
            # in the debug log (`gpufarm -vv doctor`).
            log.debug("check %s failed", check, exc_info=True)
            lines = [Line(check, Status.BROKEN, f"{type(exc).__name__}: {exc}")]
        self.say(lines)

    def type_round_trip_and_searches(self) -> None:
        """The incident type; then, on a probe incident, the round trip and the search forms (the probe is the
        search's sample: a fresh org has no other incident of gpufarm's type)."""
        found: list[str] = []

        def incident_type() -> list[Line]:
            line, type_id = check_incident_type(self.c.admin, self.o.incident_type, self.o.farm)
            found.extend([type_id] if type_id else [])
            return [line]

        self.step(INCIDENT_TYPE, incident_type)
        if not found:
            self.say([Line(ROUND_TRIP, Status.BROKEN, "needs gpufarm's incident type (above)")])
            self.step(SEARCHES, lambda: check_searches(self.c.searches, None, self.timing))
            return
        renotify, broken = preflight(self.c.admin, found[0])
        pool = probe_pool(self.c.admin, found[0], self.o.farm)
        if pool is None:
            detail = "no environment and team to create a probe in: pass --farm-config or run `gpufarm datadog apply`"
            self.say([Line(ROUND_TRIP, Status.BROKEN, detail)])
            self.step(SEARCHES, lambda: check_searches(self.c.searches, None, self.timing))
            return
        try:
            with probe_incident(self.c.incidents, self.scratch, *pool) as record:
                if renotify is None:
                    self.say([broken] if broken else [])
                else:
                    self.step(ROUND_TRIP, lambda: [self.round_trip(record.id, renotify)])
                self.step(SEARCHES, lambda: self.searches(record.id))
        except GpufarmError as exc:
            # The probe could not be made: the round trip cannot run, the searches probe gpufarm's newest incident.
            self.say([Line(ROUND_TRIP, Status.BROKEN, f"could not create the probe incident: {exc}")])
            self.step(SEARCHES, lambda: check_searches(self.c.searches, None, self.timing))

    def round_trip(self, probe_id: str, renotify: list[str]) -> Line:
        return check_round_trip(self.c.incidents, probe_id, renotify, self.timing)

    def searches(self, probe_id: str) -> list[Line]:
        return check_searches(self.c.searches, self.c.incidents.get(probe_id), self.timing)

    def urls(self) -> list[Line]:
        urls = {INGRESS: self.o.ingress_url, PAGES: self.o.profile_pages_url, UPLOAD: self.o.profile_upload_url}
        conflicts: list[Line] = []
        for name, webhook, given in (
            (INCIDENT, INCIDENT_WEBHOOK, self.o.incident_webhook_url),
            (IDLE, IDLE_WEBHOOK, self.o.idle_webhook_url),
        ):
            deployed = str((self.c.admin.get_webhook(webhook) or {}).get("url") or "") or None
            if given and deployed and given.strip() != deployed:
                detail = f"Datadog's webhook {webhook} calls {deployed}, not {given}: run `gpufarm datadog apply`"
                conflicts.append(Line(f"url {name}", Status.BROKEN, detail))
            urls[name] = given or deployed
        return [*conflicts, *check_urls(self.c.url_answer, urls)]


def run_checks(collaborators: Collaborators, options: Options, emit: Emit, timing: Timing | None = None) -> list[Line]:
    """Every check's lines, in order; each is also handed to `emit` as soon as it is known."""
    run = _Run(collaborators, options, emit, timing or Timing(options.wait_s))
    run.step(KEYS, lambda: [check_keys(collaborators.admin, options.datadog_url)])
    if run.lines[-1].status is Status.BROKEN:
        return run.lines
    try:
        run.type_round_trip_and_searches()
        run.step(HOST_TAGS, lambda: [check_tags(collaborators.hosts, options.host, run.timing, run.scratch)])
        run.step(MONITORS, lambda: check_monitors(collaborators.admin, options.farm))
        run.step(
            "slack", lambda: check_slack(collaborators.slack, collaborators.slack_missing, options.operators_channel)
        )
        run.step("urls", run.urls)
    finally:
        run.scratch.clean()
        run.say([])
    return run.lines
