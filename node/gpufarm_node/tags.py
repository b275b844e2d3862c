"""The tag contract the agent shares with the gpufarm runtime: inventory keys, IR tag values, normalisation.

The agent ships without the runtime package (no pydantic, no boto3, no Slack on a GPU node), so it carries its
own copy of these few rules; `tests/unit/test_node_tags.py` checks that both sides agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MANAGED_TAG = "gpufarm:managed"
GPU_MODEL_KEY = "gpu_model"
GPU_COUNT_KEY = "gpu_count"
ENVIRONMENT_KEY = "environment"
CLUSTER_KEY = "cluster"
IR_KEY = "ir"

_IR_RE = re.compile(r"^\s*(?:ir:)?(?:ir-?)?#?([0-9]{1,9})\s*$", re.IGNORECASE | re.ASCII)


def ir_tag_value(text: str) -> str | None:
    """`IR-123`, `ir-123`, `ir:ir-123`, `#123` or `123` as the tag value `ir-123`; None for anything else."""
    match = _IR_RE.match(text or "")
    if not match or int(match.group(1)) <= 0:
        return None
    return f"ir-{int(match.group(1))}"


def normalize_tag(tag: str) -> str:
    """Datadog's normalisation: lowercase, at most 200 characters, odd characters become `_`."""
    return "".join(ch if ch.isalnum() or ch in "_-:./" else "_" for ch in tag.lower()[:200])


def tag_values(tags: Iterable[str], key: str) -> list[str]:
    """Every value of `key:value` tags, in order."""
    prefix = f"{key}:"
    return [tag[len(prefix) :] for tag in tags if tag.startswith(prefix)]


def registration_tags(gpu_model: str, gpu_count: int, environment: str, cluster: str) -> list[str]:
    """The tags a node sets on itself so it joins the inventory."""
    return [
        MANAGED_TAG,
        normalize_tag(f"{GPU_MODEL_KEY}:{gpu_model}"),
        f"{GPU_COUNT_KEY}:{gpu_count}",
        normalize_tag(f"{ENVIRONMENT_KEY}:{environment}"),
        normalize_tag(f"{CLUSTER_KEY}:{cluster}"),
    ]
