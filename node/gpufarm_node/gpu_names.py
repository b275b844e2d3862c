"""A GPU's short model name, as tags and the inventory spell it, from the name NVML gives."""

from __future__ import annotations

import re

_MODEL_PREFIXES = ("NVIDIA", "TESLA", "GEFORCE", "QUADRO")


def gpu_model(name: str) -> str:
    """A short model from an NVML name: `NVIDIA H100 80GB HBM3` -> `H100`, `NVIDIA A100-SXM4-80GB` -> `A100`."""
    words = [w for w in re.split(r"\s+", name.strip()) if w]
    while words and words[0].upper() in _MODEL_PREFIXES:
        words.pop(0)
    picked: list[str] = []
    for word in words:
        picked.append(word.split("-")[0])
        if any(ch.isdigit() for ch in word):
            break
    return "-".join(picked).upper() or "UNKNOWN"
