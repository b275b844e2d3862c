"""What a node's Kubernetes Node carries while a dedicated lease holds it, and the patch that gets it there (pure).

While lease IR-<n> holds the whole host, its Node carries the label `gpufarm.io/ir=ir-<n>` and the taint
`gpufarm.io/lease=ir-<n>:NoSchedule`; without a lease, neither. gpufarm owns that label key and every taint with that
key, and nothing else: other labels and taints pass through untouched.

The patch is a merge patch the Kubernetes API reads alike as JSON merge patch and strategic merge patch: labels are a
map (a null value deletes the key), and `spec.taints` has no merge key, so it is replaced as a whole, with the
node's other taints copied as read. It names the `resourceVersion` read, so a Node changed in between is refused
(409 Conflict) and read again, never overwritten. `tests/unit/test_enforce_contract.py` holds the label and taint
keys equal to the runtime's (gpufarm.core.config.enforce), whose submit hint tells the lease's pods how to land here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

LABEL = "gpufarm.io/ir"
TAINT = "gpufarm.io/lease"
TAINT_EFFECT = "NoSchedule"
# A lease as a label and taint value: `ir-<n>` (a valid label value: at most 63 characters, alphanumerics and `-`).
_IR_VALUE = re.compile(r"^ir-[1-9][0-9]{0,8}$")


class PlanError(ValueError):
    """The lease value or the Node read is not one gpufarm can plan from."""


def check_ir(ir: str | None) -> str | None:
    """`ir-<n>` or None, checked: the value goes into a label and a taint."""
    if ir is not None and not _IR_VALUE.match(ir):
        raise PlanError(f"{ir[:40]!r} is not a lease value (ir-<n>)")
    return ir


def lease_taint(ir: str) -> dict[str, str]:
    """The taint of lease `ir` as the API spells it."""
    return {"key": TAINT, "value": ir, "effect": TAINT_EFFECT}


def marks(node: Mapping[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """The gpufarm label's value on a Node (its API JSON) and the gpufarm taints it carries."""
    metadata = node.get("metadata")
    spec = node.get("spec")
    if not isinstance(metadata, Mapping):
        raise PlanError("the Node has no metadata")
    labels = metadata.get("labels") or {}
    taints = (spec.get("taints") if isinstance(spec, Mapping) else None) or []
    if not isinstance(labels, Mapping) or not isinstance(taints, list):
        raise PlanError("the Node's labels or taints are not in the API's shape")
    label = labels.get(LABEL)
    ours = [t for t in taints if isinstance(t, Mapping) and t.get("key") == TAINT]
    return (label if isinstance(label, str) else None), [dict(t) for t in ours]


def node_patch(node: Mapping[str, Any], ir: str | None) -> dict[str, Any] | None:
    """The patch taking the Node to what lease `ir` (None: no lease) calls for; None when it holds that already."""
    ir = check_ir(ir)
    label, ours = marks(node)
    metadata: Mapping[str, Any] = node["metadata"]
    label_ok = label == ir and (ir is not None or LABEL not in (metadata.get("labels") or {}))
    want = [lease_taint(ir)] if ir is not None else []
    taints_ok = [{k: t.get(k) for k in ("key", "value", "effect")} for t in ours] == want
    if label_ok and taints_ok:
        return None
    patch_meta: dict[str, Any] = {}
    version = metadata.get("resourceVersion")
    if isinstance(version, str) and version:
        patch_meta["resourceVersion"] = version
    if not label_ok:
        patch_meta["labels"] = {LABEL: ir}
    patch: dict[str, Any] = {"metadata": patch_meta}
    if not taints_ok:
        patch["spec"] = {"taints": _other_taints(node) + want}
    return patch


def _other_taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Node's taints gpufarm does not own, as read."""
    spec = node.get("spec") or {}
    return [dict(t) for t in spec.get("taints") or [] if not (isinstance(t, Mapping) and t.get("key") == TAINT)]


def describe(patch: Mapping[str, Any]) -> str:
    """One line saying what a patch changes, for the log."""
    parts = []
    labels = (patch.get("metadata") or {}).get("labels")
    if labels is not None:
        value = labels.get(LABEL)
        parts.append(f"label {LABEL}={value}" if value else f"label {LABEL} removed")
    spec = patch.get("spec")
    if spec is not None:
        ours = [t for t in spec.get("taints") or [] if t.get("key") == TAINT]
        parts.append(f"taint {TAINT}={ours[0]['value']}:{TAINT_EFFECT}" if ours else f"taint {TAINT} removed")
    return ", ".join(parts) or "nothing"
