"""How a series payload is compressed for Datadog's v2 intake, which accepts `Content-Encoding: zstd1`, `gzip`
or `deflate` (datadog-api-client's MetricContentEncoding).

zstd at level 1 is the default when `zstandard` is installed (a declared dependency of gpufarm-node): on the
agent's own JSON it costs a fifth of zlib's level 1 for about 60 % of its bytes (docs/nvml.md §10). gzip at
level 1 stays the fallback for an install without it; both go through the same 512,000-byte limit, which
Datadog applies to the compressed body whatever its encoding.
"""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Callable

ZSTD = "zstd1"
GZIP = "gzip"
ENCODINGS = (ZSTD, GZIP)


def default_encoding() -> str:
    """zstd1 when the zstandard binding is importable, else gzip."""
    return ZSTD if importlib.util.find_spec("zstandard") is not None else GZIP


def compressor(encoding: str) -> Callable[[bytes], bytes]:
    """The function that compresses a whole payload for `encoding` (one of ENCODINGS)."""
    if encoding == ZSTD:
        import zstandard

        # One compressor object reused for every push: its context is allocated once. The frame carries the
        # content size, as Datadog's own agent writes it.
        return zstandard.ZstdCompressor(level=1, write_content_size=True).compress
    if encoding == GZIP:
        # Level 1: half the CPU of the default for ~10 % more bytes on this very repetitive JSON.
        return lambda data: gzip.compress(data, compresslevel=1)
    raise ValueError(f"unsupported series encoding {encoding!r}; expected one of {', '.join(ENCODINGS)}")
