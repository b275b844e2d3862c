"""`gpufarm datadog apply`: read what Datadog holds, plan (gpufarm.setup.plan), execute, idempotently.

Executing applies a plan's changes in dependency order: gpufarm's incident type first (fields and notification
rules need its id), then its fields, the secret variable, the webhooks, the rules, the idle monitors (created,
updated in place, and with `--prune` deleted), gpufarm's dashboards (the same) and the metric
metadata. A second run plans
nothing but "unchanged"; a run stopped half-way leaves nothing inconsistent that the next run does not converge.

Before anything is executed (and on a dry run too: planning reads Datadog anyway), Datadog validates each monitor
the plan creates or updates (validate_monitors): one it refuses is a blocked change carrying Datadog's reason, and
a plan with a blocked change executes nothing, so a monitor Datadog would refuse never leaves the others half made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from gpufarm.config import SecretStr
from gpufarm.core.kernel.errors import NotFound, ValidationFailed
from gpufarm.core.kernel.hosts import MANAGED_TAG
from gpufarm.setup.api import SetupApi
from gpufarm.setup.changes import Action, Change
from gpufarm.setup.dashboards import KIND as DASHBOARD
from gpufarm.setup.dashboards import METADATA_KIND, dashboard_key
from gpufarm.setup.monitors import KIND as MONITOR
from gpufarm.setup.plan import (
    DEFAULT_INCIDENT_TYPE,
    CurrentState,
    Plan,
    SetupSpec,
    gpufarm_types,
    plan_setup,
)
from gpufarm.setup.webhooks import IDLE_WEBHOOK, INCIDENT_WEBHOOK, SECRET_VARIABLE

# -- reading and executing ------------------------------------------------------------------------------------


def read_current(
    api: SetupApi,
    incident_type: str = DEFAULT_INCIDENT_TYPE,
    *,
    with_monitors: bool = False,
    with_dashboards: bool = False,
    metrics: Sequence[str] = (),
) -> CurrentState:
    """Read everything apply manages (the fields of gpufarm's incident type only; monitors and gpufarm's dashboards
    when asked; the metadata of the metrics named)."""
    types = api.list_incident_types()
    named = gpufarm_types(types, incident_type)
    fields = api.list_field_definitions(str(named[0]["id"])) if len(named) == 1 else []
    return CurrentState(
        incident_types=types,
        fields=fields,
        webhooks={name: api.get_webhook(name) for name in (INCIDENT_WEBHOOK, IDLE_WEBHOOK)},
        variable=api.get_custom_variable(SECRET_VARIABLE),
        rules=api.list_notification_rules(),
        monitors=api.list_monitors(monitor_tags=MANAGED_TAG) if with_monitors else [],
        dashboards=read_dashboards(api) if with_dashboards else [],
        metric_metadata={metric: api.get_metric_metadata(metric) for metric in metrics},
    )


def read_dashboards(api: SetupApi) -> list[dict[str, Any]]:
    """The whole definitions of the dashboards carrying gpufarm's ownership marker (nobody else's is read)."""
    out: list[dict[str, Any]] = []
    for summary in api.list_dashboards():
        if dashboard_key(summary) is None:
            continue
        found = api.get_dashboard(str(summary["id"]))
        if found is not None and dashboard_key(found) is not None:
            out.append(found)
    return out


def validate_monitors(plan: Plan, api: SetupApi) -> Plan:
    """Have Datadog validate every monitor the plan creates or updates, changing nothing.

    A new monitor goes to `POST /api/v1/monitor/validate`, an update to its monitor's own validate endpoint. One
    Datadog refuses becomes a blocked change whose detail is Datadog's reason; the returned plan names the monitors
    Datadog accepted. Failures other than a refusal (Datadog unreachable, keys refused) raise.
    """
    changes: list[Change] = []
    accepted: list[str] = []
    for change in plan.changes:
        if change.kind != MONITOR or change.action not in (Action.CREATE, Action.UPDATE):
            changes.append(change)
            continue
        existing = int(change.target_id) if change.action is Action.UPDATE and change.target_id else None
        try:
            api.validate_monitor(change.body, existing)
        except ValidationFailed as refused:
            changes.append(replace(change, action=Action.BLOCKED, detail=refused.message, differences=()))
            continue
        accepted.append(change.name)
        changes.append(change)
    return replace(plan, changes=tuple(changes), validated_monitors=tuple(accepted))


def execute(plan: Plan, api: SetupApi, secret: SecretStr | None) -> list[Change]:
    """Apply a plan's creates and updates in order; refuses a plan with blocked changes."""
    if plan.blocked:
        raise ValidationFailed(plan.blocked[0].kind, "; ".join(c.line() for c in plan.blocked))
    done: list[Change] = []
    type_id = plan.incident_type_id
    for change in plan.pending:
        if change.kind == "incident type":
            type_id = str(api.create_incident_type(change.name, str(change.body["description"]))["id"])
            # The done list carries the new type's id: what GPUFARM_INCIDENT_TYPE_ID may be set to.
            done.append(replace(change, target_id=type_id))
            continue
        if type_id is None:
            raise AssertionError("a plan without blocked changes has or creates its incident type")
        _execute_one(change, type_id, api, secret)
        done.append(change)
    return done


def _execute_one(change: Change, type_id: str, api: SetupApi, secret: SecretStr | None) -> None:
    create = change.action is Action.CREATE
    if change.kind == "field":
        if create:
            api.create_field_definition(change.body, type_id)
        else:
            assert change.target_id is not None
            api.update_field_definition(change.target_id, change.body)
    elif change.kind == "custom variable":
        if secret is None:
            raise ValidationFailed("webhook_secret", "GPUFARM_WEBHOOK_SECRET is not set")
        value = secret.get_secret_value()
        if create:
            api.create_custom_variable(change.name, value, is_secret=True)
        else:
            api.update_custom_variable(change.name, value, is_secret=True)
    elif change.kind == "webhook":
        if create:
            api.create_webhook(change.body)
        else:
            api.update_webhook(change.name, change.body)
    elif change.kind in _NO_TYPE_EXECUTORS:
        _NO_TYPE_EXECUTORS[change.kind](change, api)
    elif change.kind == "notification rule":
        if create:
            api.create_notification_rule(change.body, type_id)
        else:
            assert change.target_id is not None
            api.update_notification_rule(change.target_id, change.body, type_id)
    else:
        raise AssertionError(f"no executor for {change.kind}")


def _execute_monitor(change: Change, api: SetupApi) -> None:
    if change.action is Action.CREATE:
        api.create_monitor(change.body)
        return
    assert change.target_id is not None
    if change.action is Action.DELETE:
        api.delete_monitor(int(change.target_id))
    else:
        api.update_monitor(int(change.target_id), change.body)


def _execute_dashboard(change: Change, api: SetupApi) -> None:
    if change.action is Action.CREATE:
        api.create_dashboard(change.body)
        return
    assert change.target_id is not None
    if change.action is Action.DELETE:
        api.delete_dashboard(change.target_id)
    else:
        api.update_dashboard(change.target_id, change.body)


def _execute_metadata(change: Change, api: SetupApi) -> None:
    try:
        api.update_metric_metadata(change.name, change.body)
    except NotFound:
        # A Datadog that takes metadata only for metrics it has seen: the next apply after the first point sets it.
        return


# Objects that do not hang off gpufarm's incident type.
_NO_TYPE_EXECUTORS: dict[str, Callable[[Change, SetupApi], None]] = {
    MONITOR: _execute_monitor,
    DASHBOARD: _execute_dashboard,
    METADATA_KIND: _execute_metadata,
}


def apply_setup(api: SetupApi, spec: SetupSpec, *, secret: SecretStr | None, dry_run: bool = False) -> Plan:
    """Read, plan, have Datadog validate the monitors and (unless dry_run) execute; returns the plan (raises
    ValidationFailed if blocked, a monitor Datadog refused included)."""
    current = read_current(
        api,
        spec.incident_type,
        with_monitors=spec.monitors is not None,
        with_dashboards=spec.dashboards is not None,
        metrics=sorted(spec.metric_metadata or {}),
    )
    plan = validate_monitors(plan_setup(current, spec), api)
    if not dry_run:
        execute(plan, api, secret)
    return plan
