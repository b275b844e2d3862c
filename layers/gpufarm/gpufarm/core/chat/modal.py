"""The request modal: its fields as the farm allows them, and reading a submission back into form values."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpufarm.core.chat.block_kit import _option, _plain
from gpufarm.core.config.farm import FarmConfig, PoolKind
from gpufarm.core.kernel.model import MAX_GPU_COUNT, MAX_PURPOSE

REQUEST_CALLBACK = "gpu_request"
# Block ids of the modal's inputs; they match the request field names so a ValidationFailed(field) maps to a block.
FORM_BLOCKS = (
    "gpu_model",
    "gpu_count",
    "environment",
    "team",
    "project",
    "duration_days",
    "idle_window",
    "idle_grace",
    "purpose",
)


def request_modal(farm: FarmConfig, *, channel: str | None, initial: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The request form; private_metadata keeps the channel the command came from."""
    init = dict(initial or {})
    models = [_option(name, f"{name} {spec.description}".strip()) for name, spec in sorted(farm.gpu_models.items())]
    envs = [
        _option(name, f"{name} ({'shared slices' if env.kind is PoolKind.SHARED else 'whole hosts'})")
        for name, env in sorted(farm.environments.items())
    ]
    teams = [_option(name, name) for name in sorted(farm.teams)]
    max_days = max((t.max_days for t in farm.teams.values()), default=farm.defaults.duration_days)
    return {
        "type": "modal",
        "callback_id": REQUEST_CALLBACK,
        "title": _plain("Request GPUs"),
        "submit": _plain("Request"),
        "close": _plain("Cancel"),
        "notify_on_close": True,
        "private_metadata": json.dumps({"channel": channel} if channel else {}),
        "blocks": [
            _select("gpu_model", "GPU model", models, init.get("gpu_model")),
            _number("gpu_count", "How many GPUs", 1, MAX_GPU_COUNT, init.get("gpu_count")),
            _select("environment", "Environment", envs, init.get("environment")),
            _select("team", "Team", teams, init.get("team")),
            _text_input("project", "Project", 63, init.get("project"), placeholder="llm-ko"),
            _number(
                "duration_days", "Days", 1, max_days, init.get("duration_days") or str(farm.defaults.duration_days)
            ),
            # The lease's own idle window and grace, within the pool's bounds (gpufarm.core.governance.idle_choice).
            _text_input(
                "idle_window",
                "Idle before warning (optional)",
                8,
                init.get("idle_window"),
                optional=True,
                placeholder="2h",
            ),
            _text_input(
                "idle_grace",
                "Grace after warning (optional)",
                8,
                init.get("idle_grace"),
                optional=True,
                placeholder="30m",
            ),
            _text_input("purpose", "Purpose", MAX_PURPOSE, init.get("purpose"), multiline=True, optional=True),
        ],
    }


def _select(block_id: str, label: str, options: list[dict[str, Any]], initial: str | None) -> dict[str, Any]:
    element: dict[str, Any] = {"type": "static_select", "action_id": block_id, "options": options[:100]}
    chosen = next((o for o in options if o["value"] == initial), None)
    if chosen is not None:
        element["initial_option"] = chosen
    return {"type": "input", "block_id": block_id, "label": _plain(label), "element": element}


def _number(block_id: str, label: str, low: int, high: int, initial: str | None) -> dict[str, Any]:
    element: dict[str, Any] = {
        "type": "number_input",
        "action_id": block_id,
        "is_decimal_allowed": False,
        "min_value": str(low),
        "max_value": str(high),
    }
    if initial:
        element["initial_value"] = initial
    return {"type": "input", "block_id": block_id, "label": _plain(label), "element": element}


def _text_input(
    block_id: str,
    label: str,
    max_length: int,
    initial: str | None,
    *,
    multiline: bool = False,
    optional: bool = False,
    placeholder: str | None = None,
) -> dict[str, Any]:
    element: dict[str, Any] = {
        "type": "plain_text_input",
        "action_id": block_id,
        "max_length": max_length,
        "multiline": multiline,
    }
    if initial:
        element["initial_value"] = initial
    if placeholder:
        element["placeholder"] = _plain(placeholder)
    return {"type": "input", "block_id": block_id, "label": _plain(label), "optional": optional, "element": element}


def form_values(state_values: Mapping[str, Any]) -> dict[str, str | None]:
    """Read the modal's `view.state.values` into raw strings per field (selects give their option value)."""
    out: dict[str, str | None] = {}
    for block_id in FORM_BLOCKS:
        block = state_values.get(block_id)
        element = block.get(block_id) if isinstance(block, Mapping) else None
        if not isinstance(element, Mapping):
            out[block_id] = None
            continue
        selected = element.get("selected_option")
        value = selected.get("value") if isinstance(selected, Mapping) else element.get("value")
        out[block_id] = value if isinstance(value, str) else None
    return out
