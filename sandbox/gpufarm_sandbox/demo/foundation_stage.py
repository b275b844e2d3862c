"""Demo stage "foundation": Datadog setup, an incident, IR-tagged hosts and their metrics, all through the adapters.

Every step goes over HTTP through gpufarm's own adapters (datadog-api-client underneath) to the sandbox at
ctx.base_url, and each fact is read back and checked. The stage keeps to its own pool (environment
`foundation-lab`, cluster `foundation`, team `foundation-demo`) and ends by releasing what it took, so the
lifecycle stage that follows sees an untouched farm.
"""

from __future__ import annotations

import json
import os
import secrets
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufarm.config import SecretStr, Settings
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.hosts import ALLOCATION_KEYS, GpuHost
from gpufarm.core.kernel.ir import format_ir, ir_tag
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import GpuRequest, encode_host_gpus
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm_node.tags import registration_tags
from gpufarm_sandbox.demo.context import DemoContext

TEAM = "foundation-demo"
PROJECT = "foundation"
ENVIRONMENT = "foundation-lab"
CLUSTER = "foundation"
GPU_MODEL = "H100"
GPUS_PER_HOST = 8
HOSTS = ("foundation-gpu-01", "foundation-gpu-02", "foundation-gpu-03")
ALLOCATED = HOSTS[:2]
# Utilization each host reports: the two allocated hosts work, the third sits free and idle.
UTILIZATION = {"foundation-gpu-01": 92.0, "foundation-gpu-02": 68.0, "foundation-gpu-03": 0.0}
METRIC = "gpufarm.gpu.utilization"
DEMO_VALUES: Mapping[str, Sequence[str]] = {"team": [TEAM], "gpu_model": [GPU_MODEL], "environment": [ENVIRONMENT]}


def run(ctx: DemoContext) -> None:
    """Apply the Datadog setup, create an incident, tag hosts, push and query metrics, then release."""
    from gpufarm.adapters.datadog import DatadogGateway
    from gpufarm.adapters.datadog_admin import DatadogAdmin

    settings = stage_settings(ctx)
    gateway = DatadogGateway(settings)
    admin = DatadogAdmin(settings)
    try:
        _run(ctx, settings, gateway, admin)
    finally:
        gateway.close()
        admin.close()


def stage_settings(ctx: DemoContext) -> Settings:
    """ctx.settings aimed at the sandbox with the sandbox's own keys (real keys must never go to it)."""
    sandbox = ctx.sandbox
    secret = ctx.settings.webhook_secret
    if secret is None or not secret.get_secret_value():
        # Nothing checks the header in a bare sandbox run; under `gpufarm local` the environment sets one.
        secret = SecretStr(secrets.token_urlsafe(24))
    return ctx.settings.replace(
        datadog_host=ctx.base_url,
        datadog_api_key=SecretStr(sorted(sandbox.dd_api_keys)[0]),
        datadog_app_key=SecretStr(sorted(sandbox.dd_app_keys)[0]),
        webhook_secret=secret,
    )


def _run(ctx: DemoContext, settings: Settings, gateway: Any, admin: Any) -> None:
    if not _setup(ctx, settings, admin):
        return
    if not _seed_hosts(ctx, gateway):
        return
    record = _create_incident(ctx, gateway, admin)
    if record is None:
        return
    if not _allocate(ctx, gateway, record.id, record.public_id):
        return
    _metrics(ctx, gateway, record.public_id)
    _release(ctx, gateway, record.id, record.public_id)


def _setup(ctx: DemoContext, settings: Settings, admin: Any) -> bool:
    from gpufarm.setup.apply import apply_setup
    from gpufarm.setup.plan import SetupSpec

    done = False
    with ctx.step("Datadog setup: gpufarm datadog apply"):
        env = os.environ
        spec = SetupSpec(
            incident_webhook_url=env.get("GPUFARM_INCIDENT_WEBHOOK_URL") or f"{ctx.base_url}/fn/incident_webhook/",
            idle_webhook_url=env.get("GPUFARM_IDLE_WEBHOOK_URL") or f"{ctx.base_url}/fn/idle_alert/",
            valid_values=_valid_values(settings, ctx),
            has_secret=True,
        )
        plan = apply_setup(admin, spec, secret=settings.webhook_secret)
        counts = plan.counts()
        ctx.info(", ".join(f"{n} {action}" for action, n in counts.items() if n))
        ctx.check(not plan.blocked, "setup plan has nothing blocked")
        types = [t for t in admin.list_incident_types() if t["attributes"]["name"] == settings.incident_type]
        type_id = str(types[0]["id"]) if len(types) == 1 else ""
        ctx.check(bool(type_id), f"gpufarm has its own incident type {settings.incident_type!r}", type_id)
        names = {d["attributes"]["name"] for d in admin.list_field_definitions(type_id)} if type_id else set()
        ctx.check(
            {s.name for s in f.SCHEMA} <= names,
            "every gpufarm incident field is defined on that type",
            f"{len(names)} fields",
        )
        hook = admin.get_webhook("gpufarm-incidents")
        ctx.check(
            hook is not None and "X-Gpufarm-Token" in (hook.get("custom_headers") or ""),
            "incident webhook carries the secret header",
        )
        again = apply_setup(admin, spec, secret=settings.webhook_secret)
        done = ctx.check(
            not again.pending, "a second apply changes nothing", f"{again.counts()['unchanged']} unchanged"
        )
    return done


def _valid_values(settings: Settings, ctx: DemoContext) -> dict[str, list[str]]:
    """The demo's own choices plus the farm configuration's, so later stages' values stay valid too."""
    merged = {k: list(v) for k, v in DEMO_VALUES.items()}
    try:
        from gpufarm.adapters.aws import load_farm_text
        from gpufarm.core.config.farm import parse_farm

        farm = parse_farm(load_farm_text(settings)).valid_values()
    except GpufarmError as exc:
        ctx.info(f"no farm configuration used ({exc})")
        return merged
    for key, values in farm.items():
        merged[key] = sorted({*merged.get(key, []), *values})
    return merged


def _seed_hosts(ctx: DemoContext, gateway: Any) -> bool:
    ok = False
    with ctx.step(f"Seed {len(HOSTS)} GPU hosts with their registration tags"):
        tags = registration_tags(GPU_MODEL, GPUS_PER_HOST, ENVIRONMENT, CLUSTER)
        body = {"hosts": [{"name": name, "tags": {"user": tags}} for name in HOSTS]}
        _post_json(f"{ctx.base_url}/_sandbox/hosts", body)
        listed = {h.name: h for h in gateway.list_hosts(f"cluster:{CLUSTER}")}
        ctx.check(set(listed) == set(HOSTS), "Datadog lists the hosts", ", ".join(sorted(listed)))
        inventory = [GpuHost.from_tags(h.name, h.tags) for h in listed.values()]
        ok = ctx.check(
            all(g is not None and g.gpu_count == GPUS_PER_HOST and not g.irs for g in inventory),
            "each host joins the inventory, free",
            f"{GPU_MODEL} x{GPUS_PER_HOST}, environment {ENVIRONMENT}",
        )
    return ok


def _create_incident(ctx: DemoContext, gateway: Any, admin: Any) -> Any:
    record: Any = None
    with ctx.step("Create the allocation incident"):
        request = GpuRequest(
            team=TEAM,
            project=PROJECT,
            gpu_model=GPU_MODEL,
            gpu_count=GPUS_PER_HOST * len(ALLOCATED),
            environment=ENVIRONMENT,
            duration_days=1,
            purpose="foundation demo: adapters end to end",
            requester="U0000000001",
            request_id=f"demo-foundation-{uuid.uuid4().hex[:16]}",
        )
        now = ctx.sandbox.clock.now_dt()
        # Created as "requested": an "approved" incident would make the lifecycle handler allocate from its own
        # pools; this stage tags its hosts itself.
        created = gateway.create(
            request.title(),
            request.to_fields(Phase.REQUESTED, now),
            initial_note="Created by the gpufarm foundation demo stage",
        )
        ctx.info(f"{format_ir(created.public_id)} ({created.id}): {created.title}")
        default = next(t["id"] for t in admin.list_incident_types() if t["attributes"]["is_default"])
        ctx.check(
            gateway.incident_type_id != default,
            "the allocation is of gpufarm's incident type, not among the org's own incidents",
            f"{gateway.incident_type_name} ({gateway.incident_type_id})",
        )
        ctx.check(
            created.fields.get("slug") == format_ir(created.public_id),
            "incident number is the IR",
            created.fields.get("slug") or "",
        )
        fetched = gateway.get(created.id)
        by_ir = gateway.get_by_ir(created.public_id)
        ctx.check(
            fetched.id == by_ir.id == created.id and fetched.fields.get(f.GPU_COUNT) == str(request.gpu_count),
            "read back by UUID and by IR with its fields",
            f"{fetched.fields.get(f.TEAM)}/{fetched.fields.get(f.PROJECT)} {fetched.fields.get(f.GPU_COUNT)}x"
            f"{fetched.fields.get(f.GPU_MODEL)} in {fetched.fields.get(f.ENVIRONMENT)}",
        )
        retried = gateway.create(request.title(), request.to_fields(Phase.REQUESTED, now))
        if ctx.check(retried.id == created.id, "creating the same request again returns the same incident"):
            record = created
    return record


def _allocate(ctx: DemoContext, gateway: Any, incident_id: str, ir: int) -> bool:
    ok = False
    with ctx.step(f"Allocate: tag {len(ALLOCATED)} hosts with {ir_tag(ir)} and record them in the incident"):
        allocation_tags = [ir_tag(ir), f"project:{PROJECT}", f"team:{TEAM}"]
        for host in ALLOCATED:
            gateway.add_tags(host, allocation_tags)
        tagged = {host: gateway.get_tags(host) for host in HOSTS}
        ctx.check(
            all(ir_tag(ir) in tagged[h] for h in ALLOCATED) and ir_tag(ir) not in tagged[HOSTS[-1]],
            "only the allocated hosts carry the IR tag",
            ", ".join(ALLOCATED),
        )
        updated = gateway.update(
            incident_id,
            {
                f.STATE: State.STABLE.value,
                f.PHASE: Phase.ALLOCATED.value,
                f.APPROVED_BY: "policy",
                f.HOSTS: list(ALLOCATED),
                f.HOST_GPUS: encode_host_gpus(dict.fromkeys(ALLOCATED, GPUS_PER_HOST)),
            },
        )
        ok = ctx.check(
            updated.state == State.STABLE.value and updated.fields.get(f.HOSTS) == list(ALLOCATED),
            "incident is stable and lists its hosts",
            f"phase {updated.fields.get(f.PHASE)}",
        )
    return ok


def _metrics(ctx: DemoContext, gateway: Any, ir: int) -> None:
    with ctx.step("Submit GPU utilization and query it back by {ir}"):
        now = int(ctx.sandbox.clock.now())
        series = [
            MetricSeries(
                METRIC,
                tuple(MetricPoint(now - 60 * k, value) for k in range(10)),
                tags=(f"gpu:{gpu}",),
                host=host,
                unit="percent",
            )
            for host, value in UTILIZATION.items()
            for gpu in range(2)
        ]
        gateway.submit(series)
        ctx.info(f"submitted {sum(len(s.points) for s in series)} points for {len(UTILIZATION)} hosts")
        start = datetime.fromtimestamp(now, UTC) - timedelta(minutes=15)
        results = gateway.scalar(f"avg:{METRIC}{{cluster:{CLUSTER}}} by {{ir}}", start, start + timedelta(minutes=16))
        by_group = {",".join(r.group_tags): r.value for r in results}
        for group, value in sorted(by_group.items()):
            ctx.info(f"{group}: {value:.1f}%" if value is not None else f"{group}: no data")
        expected = sum(UTILIZATION[h] for h in ALLOCATED) / len(ALLOCATED)
        got = by_group.get(ir_tag(ir))
        ctx.check(
            got is not None and abs(got - expected) < 0.01,
            f"utilization of {format_ir(ir)} comes from its hosts only",
            f"{got:.1f}% (expected {expected:.1f}%)" if got is not None else "no group",
        )


def _release(ctx: DemoContext, gateway: Any, incident_id: str, ir: int) -> None:
    with ctx.step(f"Release {format_ir(ir)}: remove its tags, resolve the incident"):
        for host in ALLOCATED:
            keep = [t for t in gateway.get_tags(host) if t.split(":", 1)[0] not in ALLOCATION_KEYS]
            gateway.replace_tags(host, keep)
        ctx.check(
            all(ir_tag(ir) not in gateway.get_tags(h) for h in HOSTS),
            "no host carries the IR any more",
        )
        resolved = gateway.update(
            incident_id,
            {
                f.STATE: State.RESOLVED.value,
                f.PHASE: Phase.RECLAIMED.value,
                f.RECLAIM_REASON: ReclaimReason.RELEASED.value,
                f.HOSTS: [],
                f.HOST_GPUS: [],
            },
        )
        ctx.check(
            resolved.state == State.RESOLVED.value and resolved.resolved is not None,
            "incident resolved with its reason",
            f"{resolved.fields.get(f.PHASE)} ({resolved.fields.get(f.RECLAIM_REASON)})",
        )
        ctx.shared["foundation"] = {"ir": ir, "incident_id": incident_id, "hosts": list(HOSTS)}


def _post_json(url: str, body: Any) -> Any:
    request = urllib.request.Request(  # noqa: S310 - ctx.base_url is the local sandbox's http URL
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - same URL as above
        return json.loads(response.read() or b"null")
