"""Demo stage "lifecycle": researchers ask for GPUs in Slack; incidents allocate, tag, and release hosts.

Everything goes through the real path: the sandbox plays Slack users (signed slash commands and button clicks to
the ingress's Function URL), the local function host runs the five functions, Datadog's notification rules call
the incident webhook, and the FIFO queue allocates per pool. Each step is read back from the sandbox (incident
fields, host tags, Slack messages) and checked. `LocalFarm` is also what the end-to-end tests drive.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import ANY_STATE_QUERY
from gpufarm_node.tags import registration_tags
from gpufarm_sandbox.example_farm import (
    ALICE,
    BOB,
    CAROL,
    DANA,
    HOSTS,
    OPERATORS_CHANNEL,
    OPERATORS_GROUP,
    RESEARCH_CHANNEL,
    Person,
    workspace_seed,
)

if TYPE_CHECKING:
    from gpufarm.adapters.datadog import DatadogGateway
    from gpufarm.adapters.datadog_admin import DatadogAdmin
    from gpufarm.config import Settings
    from gpufarm_sandbox.demo.context import DemoContext
    from gpufarm_sandbox.localhost.start import LocalEnv
    from gpufarm_sandbox.simfarm import SimulatedFarm

INGRESS_PATH = "/fn/slack_ingress/"
SLACK_ACK_BUDGET_MS = 3000
MINUTE_S = 60.0  # one agent cycle and one monitor evaluation per simulated minute
SWEEP_FUNCTION = "QuotaSyncFunction"  # runs the sweep every minute (template.yaml, EveryMinute)


class LocalFarm:
    """Plays Slack users against a running local environment and reads back what happened."""

    def __init__(self, base_url: str, host: Any, settings: Settings) -> None:
        self.base_url = base_url.rstrip("/")
        self.host = host
        self.settings = settings
        self._gateway: DatadogGateway | None = None
        self._admin: DatadogAdmin | None = None

    @property
    def gateway(self) -> DatadogGateway:
        """gpufarm's Datadog adapter aimed at the sandbox."""
        if self._gateway is None:
            from gpufarm.adapters.datadog import DatadogGateway

            self._gateway = DatadogGateway(self.settings)
        return self._gateway

    @property
    def admin(self) -> DatadogAdmin:
        """gpufarm's setup-time Datadog adapter aimed at the sandbox."""
        if self._admin is None:
            from gpufarm.adapters.datadog_admin import DatadogAdmin

            self._admin = DatadogAdmin(self.settings)
        return self._admin

    def close(self) -> None:
        """Release HTTP pools."""
        if self._gateway is not None:
            self._gateway.close()
        if self._admin is not None:
            self._admin.close()

    # -- HTTP --------------------------------------------------------------------------------------------------------

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """POST JSON to the sandbox or a function; (status, parsed body)."""
        data = json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - the local environment's own http URL
            self.base_url + path,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw) if raw.strip() else None
        except ValueError:
            return status, raw.decode("utf-8", "replace")

    def get(self, path: str) -> Any:
        """GET JSON from the sandbox."""
        with urllib.request.urlopen(self.base_url + path, timeout=30) as response:  # noqa: S310
            return json.loads(response.read())

    # -- setting the stage --------------------------------------------------------------------------------------------

    def seed_workspace(self) -> None:
        """Users, the operators' user group and channel, and the research channel."""
        for path, body in workspace_seed().items():
            self._ok(self.post(path, body))

    def seed_hosts(self, hosts: tuple[tuple[str, str, int, str, str], ...] = HOSTS) -> None:
        """GPU hosts with the tags their node agents register (kept reporting as the clock moves)."""
        body = [
            {"name": name, "tags": {"user": registration_tags(model, count, env, cluster)}, "reporting": True}
            for name, model, count, env, cluster in hosts
        ]
        self._ok(self.post("/_sandbox/hosts", {"hosts": body}))

    @classmethod
    def ready(cls, local: LocalEnv, *, drain_s: float = 10, monitors: bool = True) -> LocalFarm:
        """A reset sandbox with the workspace, the hosts and the Datadog setup `gpufarm local` makes: the same
        apply (gpufarm_sandbox.localhost.setup), idle monitors included, from the farm configuration the functions
        read. `monitors=False` leaves the monitors out, for a test that must not meet an idle alert."""
        from gpufarm.config import Settings
        from gpufarm.core.config.farm import parse_farm
        from gpufarm.handlers import runtime
        from gpufarm_sandbox.localhost.setup import apply_local_setup

        local.host.drain(timeout=drain_s)
        local.sandbox.reset()
        runtime.reset()
        farm = cls(local.url, local.host, Settings())
        farm.seed_workspace()
        farm.seed_hosts()
        if monitors:
            if apply_local_setup(local).plan is None:
                raise RuntimeError("no farm configuration: the local Datadog setup was skipped")
            return farm
        values = parse_farm((local.host.root / "config" / "farm.example.yaml").read_text()).valid_values()
        if farm.apply_setup(values).blocked:
            raise RuntimeError("gpufarm datadog apply was blocked on the sandbox")
        return farm

    def apply_setup(self, farm_values: dict[str, list[str]]) -> Any:
        """`gpufarm datadog apply` against the sandbox: gpufarm's incident type, its fields and rules, webhooks."""
        from gpufarm.setup.apply import apply_setup
        from gpufarm.setup.plan import SetupSpec

        env = self.host.env
        spec = SetupSpec(
            incident_webhook_url=env["GPUFARM_INCIDENT_WEBHOOK_URL"],
            idle_webhook_url=env["GPUFARM_IDLE_WEBHOOK_URL"],
            valid_values=farm_values,
            has_secret=True,
        )
        return apply_setup(self.admin, spec, secret=self.settings.webhook_secret)

    @staticmethod
    def _ok(answer: tuple[int, Any]) -> None:
        if answer[0] != 200:
            raise RuntimeError(f"sandbox refused the seed data: {answer[1]}")

    # -- playing Slack users ------------------------------------------------------------------------------------------

    def slash(self, user: Person | str, text: str, channel: str = RESEARCH_CHANNEL) -> dict[str, Any]:
        """A user types `/gpu <text>`; returns the sandbox's record (status, ack body, latency, trigger)."""
        uid = user.id if isinstance(user, Person) else user
        body = {"user": uid, "channel": channel, "command": "/gpu", "text": text, "url": self.base_url + INGRESS_PATH}
        return self._deliver("/_sandbox/slack/commands", body, "command")

    def click(self, user: Person | str, message: dict[str, Any], action_id: str) -> dict[str, Any]:
        """A user clicks a button of a message the app posted."""
        uid = user.id if isinstance(user, Person) else user
        value = next(
            e["value"]
            for block in message.get("blocks", [])
            if block.get("type") == "actions"
            for e in block.get("elements", [])
            if e.get("action_id") == action_id
        )
        body = {
            "type": "block_actions",
            "user": uid,
            "url": self.base_url + INGRESS_PATH,
            "channel": message["channel"],
            "message_ts": message["ts"],
            "action_id": action_id,
            "value": value,
        }
        return self._deliver("/_sandbox/slack/interactions", body, "click")

    def submit_view(self, user: Person | str, view_id: str, values: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """A user submits an open modal with these `state.values`."""
        uid = user.id if isinstance(user, Person) else user
        body = {
            "type": "view_submission",
            "user": uid,
            "url": self.base_url + INGRESS_PATH,
            "view_id": view_id,
            "values": values,
        }
        return self._deliver("/_sandbox/slack/interactions", body, "submission")

    def _deliver(self, path: str, body: dict[str, Any], what: str) -> dict[str, Any]:
        # The sandbox's record of what its simulated user sent; a refusal means the demo's own input is wrong.
        status, answer = self.post(path, body)
        if status != 200 or not isinstance(answer, dict):
            raise RuntimeError(f"the sandbox could not deliver the {what}: {answer}")
        return answer

    def settle(self, timeout: float = 20.0) -> bool:
        """Wait until hand-offs, webhooks and queued allocations have all run.

        When the sandbox plays Datadog quirks, a step may get no webhook at all: the sweep's one-minute tick
        (gpufarm.core.sync.sweep) runs once more, as it would within the minute, and its work settles too.
        """
        settled = bool(self.host.drain(timeout=timeout))
        if self.host.sb.quirks:
            self.host.invoke(SWEEP_FUNCTION, {"job": "sweep"})
            settled = bool(self.host.drain(timeout=timeout))
        return settled

    def request_ir(self, person: Person, text: str) -> int | None:
        """`person` types `/gpu request <count> <model> ...`; the IR in the latest answer naming that model, once
        everything settled (None when no answer names one)."""
        self.slash(person, text)
        self.settle()
        model = text.split()[2]
        answers = [m for m in self.messages(user=person.id, kind="response") if model in m["text"]]
        return ir_in(answers[-1]["text"]) if answers else None

    def minute(self, nodes: SimulatedFarm, minutes: int = 1) -> bool:
        """One agent cycle pushed, the sandbox clock a minute (or more) on (the monitors evaluate), functions settled;
        whether every node's points reached the sandbox."""
        flushed = all(r.flushed for r in nodes.step_all())
        self.post("/_sandbox/clock", {"advance": MINUTE_S * minutes})
        self.settle(timeout=10)
        return flushed

    # -- reading back --------------------------------------------------------------------------------------------------

    def messages(self, **filters: str) -> list[dict[str, Any]]:
        """Slack messages the sandbox kept, in order (filters: channel, user, contains, kind)."""
        query = "&".join(f"{k}={urllib.parse.quote(v)}" for k, v in filters.items())
        found: list[dict[str, Any]] = self.get("/_sandbox/slack/messages" + (f"?{query}" if query else ""))["messages"]
        return found

    def answer(self, person: Person, contains: str) -> dict[str, Any] | None:
        """The latest answer (response_url or DM) to `person` that contains `contains`, None when there is none."""
        found = [
            m
            for kind in ("response", "dm")
            for m in self.messages(user=person.id, kind=kind, contains=contains)
            if not m.get("deleted")
        ]
        return max(found, key=lambda m: m["seq"]) if found else None

    def views(self) -> list[dict[str, Any]]:
        """Modals the app opened."""
        found: list[dict[str, Any]] = self.get("/_sandbox/slack/views")["views"]
        return found

    def allocation(self, ir: int) -> Allocation:
        """An incident, decoded."""
        return Allocation.from_record(self.gateway.get_by_ir(ir))

    def incidents(self) -> list[Allocation]:
        """Every incident, any state."""
        return [Allocation.from_record(r) for r in self.gateway.search(ANY_STATE_QUERY)]

    def user_tags(self, host: str) -> list[str]:
        """A host's user-source tags."""
        return self.gateway.get_tags(host, source="user")

    def ir_tags(self, host: str) -> list[str]:
        """The ir: tags on a host."""
        return [t for t in self.user_tags(host) if t.startswith("ir:")]

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> bool:
        """Poll until predicate() is true (webhook deliveries land a moment after the drain)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            self.settle(timeout=2.0)
            time.sleep(0.05)
        return bool(predicate())


def shown(message: dict[str, Any] | None) -> str:
    """A message's text and the text of its blocks (a reason under an answer is a context line); empty for None."""
    if message is None:
        return ""
    parts = [message.get("text") or ""]
    for block in message.get("blocks") or []:
        parts += [block["text"]["text"]] if isinstance(block.get("text"), dict) else []
        parts += [e.get("text", "") for e in block.get("elements", []) if isinstance(e.get("text"), str)]
    return " ".join(parts)


def actions(message: dict[str, Any]) -> set[str]:
    """The action ids of a Slack message's buttons."""
    return {
        str(e.get("action_id"))
        for b in message.get("blocks", [])
        if b.get("type") == "actions"
        for e in b.get("elements", [])
    }


def ir_in(text: str) -> int | None:
    """The first `IR-<n>` in a text."""
    import re

    match = re.search(r"\bIR-(\d+)\b", text)
    return int(match.group(1)) if match else None


# -- the demo ----------------------------------------------------------------------------------------------------------


def run(ctx: DemoContext) -> None:
    """Three researchers request; policy approves one, an operator another, the third is refused; one releases."""
    from gpufarm.adapters.aws import load_farm_text
    from gpufarm.core.config.farm import parse_farm

    if ctx.local is None:
        ctx.check(False, "the lifecycle stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    settings = Settings()
    farm = LocalFarm(ctx.base_url, ctx.local.host, settings)
    try:
        farm_values = parse_farm(load_farm_text(settings)).valid_values()
        with ctx.step("Seed Slack users, the operators' group and channel, and GPU hosts; apply the Datadog setup"):
            farm.seed_workspace()
            farm.seed_hosts()
            plan = farm.apply_setup(_merged_values(farm, farm_values))
            counts = ", ".join(f"{n} {action}" for action, n in plan.counts().items() if n)
            ctx.check(
                not plan.blocked,
                "datadog apply: incident type, fields, webhooks, secret variable, notification rules",
                counts,
            )
            ctx.info(f"{len(HOSTS)} hosts in 3 pools; operators group {OPERATORS_GROUP} = <@{DANA.id}> ({DANA.name})")
        alice_ir = _policy_approved(ctx, farm)
        bob_ir = _operator_approved(ctx, farm)
        _refused(ctx, farm)
        shared = _shared_slices(ctx, farm)
        if alice_ir is not None:
            _release(ctx, farm, alice_ir)
        live = [ir for ir in (bob_ir, *shared) if ir is not None]
        ctx.shared["allocations"] = {
            a.ir: {
                "ir": a.ir_label,
                "ir_tag": a.ir_tag,
                "hosts": list(a.hosts),
                "host_gpus": dict(a.host_gpus),
                "environment": a.environment,
                "gpu_model": a.gpu_model,
                "project": a.project,
                "team": a.team,
            }
            for a in (farm.allocation(ir) for ir in live)
            if a.phase is Phase.ALLOCATED
        }
        ctx.info(f"handed to the metrics stage: {sorted(ctx.shared['allocations'])}")
    finally:
        farm.close()


def _merged_values(farm: LocalFarm, values: dict[str, list[str]]) -> dict[str, list[str]]:
    """The farm's dropdown choices plus any already defined (an earlier stage's own pool stays valid)."""
    from gpufarm.setup.plan import gpufarm_types

    merged = {k: list(v) for k, v in values.items()}
    ours = gpufarm_types(farm.admin.list_incident_types(), farm.settings.incident_type)
    if len(ours) != 1:
        return merged
    for definition in farm.admin.list_field_definitions(str(ours[0]["id"])):
        attrs = definition.get("attributes", {})
        name = attrs.get("name")
        if name in merged:
            existing = [v.get("value") for v in attrs.get("valid_values") or [] if isinstance(v, dict)]
            merged[name] = sorted({*merged[name], *(v for v in existing if isinstance(v, str))})
    return merged


def _policy_approved(ctx: DemoContext, farm: LocalFarm) -> int | None:
    ir: int | None = None
    with ctx.step(f"{ALICE.name} (nlp) asks for 8 H100 on the HPC pool: within quota, approved by policy"):
        sent = farm.slash(
            ALICE, 'request 8 H100 project=llm-ko team=nlp env=onprem-hpc days=14 purpose="fine-tune the Korean LLM"'
        )
        ctx.check(sent["status"] == 200, "the ingress acknowledged", f"HTTP {sent['status']}")
        ctx.check(sent["latency_ms"] < SLACK_ACK_BUDGET_MS, "inside Slack's 3 seconds", f"{sent['latency_ms']:.0f} ms")
        farm.settle()
        answer = farm.messages(user=ALICE.id, kind="response")
        ir = ir_in(answer[-1]["text"]) if answer else None
        ctx.check(
            ir is not None, f"{ALICE.name} sees her IR number", answer[-1]["text"][:90] if answer else "no answer"
        )
        if ir is None:
            return None
        a = farm.allocation(ir)
        ctx.check(a.approved_by == "policy", "approved by policy", f"approved_by={a.approved_by}")
        ctx.check(a.phase is Phase.ALLOCATED and a.state.value == "stable", "incident stable, phase allocated")
        ctx.check(len(a.hosts) == 1 and a.host_gpus == {a.hosts[0]: 8}, "one whole HPC host", ", ".join(a.hosts))
        for host in a.hosts:
            tags = farm.user_tags(host)
            ctx.check({f"ir:ir-{ir}", "project:llm-ko", "team:nlp"} <= set(tags), f"{host} tagged", " ".join(tags[-3:]))
        dm = farm.messages(user=ALICE.id, kind="dm", contains=f"GPUFARM_IR=IR-{ir}")
        ctx.check(bool(dm), f"{ALICE.name} is told her hosts and how to carry the IR", dm[-1]["text"] if dm else "")
    return ir


def _operator_approved(ctx: DemoContext, farm: LocalFarm) -> int | None:
    ir: int | None = None
    with ctx.step(f"{BOB.name} (vision) asks for 16 H100: beyond quota, the operators decide"):
        farm.slash(BOB, "request 16 H100 project=vit-xl team=vision env=onprem-hpc days=7 purpose=pretraining")
        farm.settle()
        answer = farm.messages(user=BOB.id, kind="response")
        ir = ir_in(answer[-1]["text"]) if answer else None
        ctx.check(ir is not None and farm.allocation(ir).phase is Phase.REQUESTED, "incident waits for an operator")
        if ir is None:
            return None
        asks = [
            m for m in farm.messages(channel=OPERATORS_CHANNEL, contains="needs approval") if ir_in(m["text"]) == ir
        ]
        ctx.check(bool(asks), "the operators' channel has Approve / Reject buttons")
        if not asks:
            return None
        farm.click(BOB, asks[-1], "gpu_approve")
        farm.settle()
        denied = farm.messages(user=BOB.id, contains="only GPU operators")
        ctx.check(bool(denied), f"{BOB.name} cannot approve his own request", denied[-1]["text"] if denied else "")
        ctx.check(farm.allocation(ir).phase is Phase.REQUESTED, "and nothing changed")
        farm.click(DANA, asks[-1], "gpu_approve")
        farm.settle()
        a = farm.allocation(ir)
        ctx.check(a.approved_by == DANA.id, f"approved by {DANA.name}'s click", f"approved_by={a.approved_by}")
        ctx.check(a.phase is Phase.ALLOCATED and len(a.hosts) == 2, "two whole hosts allocated", ", ".join(a.hosts))
        clusters = {h.split("-")[1] for h in a.hosts}
        ctx.check(len(clusters) == 1, "both in one cluster", ", ".join(a.hosts))
        shared = [h for h in a.hosts if len(farm.ir_tags(h)) != 1]
        ctx.check(not shared, "no host carries two IRs", ", ".join(shared))
        updated = [m for m in farm.messages(channel=OPERATORS_CHANNEL) if m["ts"] == asks[-1]["ts"]]
        ctx.check(
            bool(updated) and f"Approved by <@{DANA.id}>" in json.dumps(updated[-1]["blocks"]),
            "the operators' message records who approved",
        )
    return ir


def _refused(ctx: DemoContext, farm: LocalFarm) -> None:
    with ctx.step(f"{CAROL.name} (speech) asks for 6 L4 slices: over her team's hard limit, refused"):
        before = len(farm.incidents())
        farm.slash(CAROL, "request 6 L4 project=asr team=speech env=shared-slices days=3")
        farm.settle()
        answer = farm.messages(user=CAROL.id, kind="response")
        text = answer[-1]["text"] if answer else ""
        ctx.check("refused" in text and "hard limit of 4" in text, "refused with the reason", text[:100])
        ctx.check(len(farm.incidents()) == before, "no incident was created")


def _shared_slices(ctx: DemoContext, farm: LocalFarm) -> list[int]:
    irs: list[int] = []
    with ctx.step("Two teams take L4 slices of one shared node (GPU slicing: no host exclusivity)"):
        for person, team, project in ((CAROL, "speech", "asr"), (BOB, "vision", "ocr")):
            farm.slash(person, f"request 2 L4 project={project} team={team} env=shared-slices days=3")
        farm.settle()
        for person in (CAROL, BOB):
            answer = farm.messages(user=person.id, kind="response", contains="L4")
            ir = ir_in(answer[-1]["text"]) if answer else None
            if ir is not None:
                irs.append(ir)
        allocs = [farm.allocation(ir) for ir in irs]
        ctx.check(len(allocs) == 2 and all(a.phase is Phase.ALLOCATED for a in allocs), "both allocated by policy")
        hosts = {h for a in allocs for h in a.hosts}
        tags = farm.ir_tags("k8s-l4-01")
        ctx.check(hosts == {"k8s-l4-01"} and len(tags) == 2, "one node carries both IRs", " ".join(tags))
    return irs


def _release(ctx: DemoContext, farm: LocalFarm, ir: int) -> None:
    with ctx.step(f"{ALICE.name} releases IR-{ir}"):
        hosts = farm.allocation(ir).hosts
        farm.slash(ALICE, f"release IR-{ir} now")
        farm.settle()
        a = farm.allocation(ir)
        ctx.check(
            a.phase is Phase.RECLAIMED and a.reclaim_reason is ReclaimReason.RELEASED,
            "phase reclaimed, reason released",
        )
        ctx.check(a.state.value == "resolved" and not a.hosts, "incident resolved, hosts field cleared")
        leftover = [t for h in hosts for t in farm.user_tags(h) if t.split(":")[0] in ("ir", "project", "team")]
        ctx.check(not leftover, "its tags are gone from " + ", ".join(hosts), " ".join(leftover))
        told = farm.messages(user=ALICE.id, kind="dm", contains=f"IR-{ir}")
        ctx.check(
            bool(told) and "reclaimed" in told[-1]["text"], f"{ALICE.name} is told", told[-1]["text"] if told else ""
        )
        ops = farm.messages(channel=OPERATORS_CHANNEL, contains="reclaimed")
        ctx.check(any(ir_in(m["text"]) == ir for m in ops), "the operators are told")
