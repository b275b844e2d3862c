"""Holds a series gpufarm builds to its declaration in spec/metrics.yaml: name, type, unit, tags and tag values.

One check for every section of the spec that declares `MetricSeries` gpufarm itself sends (`profile_metrics`,
`lifecycle_metrics`); the node agent's series have their own richer check in tests/unit/test_node_spec.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from gpufarm.core.kernel.ports import MetricSeries

ROOT = Path(__file__).resolve().parents[1]
SPEC: dict[str, Any] = yaml.safe_load((ROOT / "spec" / "metrics.yaml").read_text())
# MetricSeries.type as Datadog's v2 intake numbers it.
TYPES = {"gauge": 3, "count": 1}


def _expand(keys: list[str]) -> set[str]:
    """Tag keys, a tagset's name standing for its keys."""
    return {k for key in keys for k in SPEC["tagsets"].get(key, [key])}


def problems(s: MetricSeries, section: str) -> list[str]:
    """What is wrong with `s` against its declaration under `section` of the spec (empty when nothing is)."""
    spec = SPEC[section].get(s.metric)
    if spec is None:
        return [f"{s.metric} is not declared"]
    out = []
    if s.type != TYPES[spec["type"]] or s.unit != spec["unit"]:
        out.append(f"{s.metric}: type/unit {s.type}/{s.unit}")
    keys = {t.partition(":")[0]: t.partition(":")[2] for t in s.tags}
    required, optional = _expand(spec["tags"].get("required", [])), _expand(spec["tags"].get("optional", []))
    out += [f"{s.metric} misses {k}" for k in required - set(keys)]
    for key, value in keys.items():
        if key not in required | optional:
            out.append(f"{s.metric} carries undeclared tag {key}")
        elif not re.match(SPEC["tags"][key]["value"], value):
            out.append(f"{s.metric}: {key}:{value} does not match")
    return out
