"""Kubernetes API JSON held to the OpenAPI schema as the kubernetes client carries it: its generated models (V1Node,
V1Status, V1Pod...; generated from the upstream OpenAPI v2 spec) name each field and its type, and every field of an
answer must be one of them, of that type."""

from __future__ import annotations

import re
from typing import Any

from kubernetes.client import models

_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict\(str, (.+)\)$")
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "datetime": (str,),
    "date": (str,),
    "object": (object,),
}


def conforms(value: Any, kind: str, where: str = "") -> list[str]:
    """Where `value` (API JSON) departs from the client's model type `kind` (e.g. "V1Node")."""
    if value is None:
        return []
    if kind in _PRIMITIVES:
        return [] if isinstance(value, _PRIMITIVES[kind]) else [f"{where}: {type(value).__name__} is not {kind}"]
    if match := _LIST.match(kind):
        if not isinstance(value, list):
            return [f"{where}: not a list"]
        return [p for i, v in enumerate(value) for p in conforms(v, match.group(1), f"{where}[{i}]")]
    if match := _DICT.match(kind):
        if not isinstance(value, dict):
            return [f"{where}: not a map"]
        return [p for k, v in value.items() for p in conforms(v, match.group(1), f"{where}.{k}")]
    model = getattr(models, kind)
    if not isinstance(value, dict):
        return [f"{where}: not an object ({kind})"]
    by_json = {json_name: model.openapi_types[attr] for attr, json_name in model.attribute_map.items()}
    problems = [f"{where}.{k}: not a field of {kind}" for k in value if k not in by_json]
    return problems + [p for k, v in value.items() if k in by_json for p in conforms(v, by_json[k], f"{where}.{k}")]
