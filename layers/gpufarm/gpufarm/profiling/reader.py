"""Bounded, streaming reading of the Chrome-trace JSON that `torch.profiler` exports (gzipped or not).

A trace is one JSON object whose `traceEvents` array holds every span; a training run's trace is easily a few
hundred megabytes. Loading that with `json.load` costs several times its size in Python objects (a 200 MB trace
needs well over 1 GB), so the events are streamed one at a time with ijson's C backend and never held whole.

Bounds, checked before anything is stored: the file's size is read from the file system first (at least
MAX_TRACE_BYTES is refused unread), a gzipped file stops once its inflated text passes the same limit (a small
file that inflates to terabytes is refused too), a truncated gzip or JSON stream is an error, and a JSON document
without a `traceEvents` array of span objects is "not a trace". Every refusal is a ValidationFailed whose message
is safe to show (it names the file, never its content).
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import ijson

from gpufarm.core.kernel.errors import ValidationFailed

# "A trace of 2 GB" is refused: what torch.profiler writes for one profiled window is far below this.
MAX_TRACE_BYTES = 2 * 10**9
GZIP_MAGIC = b"\x1f\x8b"
FIELD = "trace"


class _Bounded(io.RawIOBase):
    """A reader that fails once more than `limit` bytes came through (bounds what a gzip stream inflates to)."""

    def __init__(self, inner: IO[bytes], limit: int, name: str) -> None:
        self.inner = inner
        self.limit = limit
        self.name = name
        self.seen = 0

    def readable(self) -> bool:
        """Always: this wraps a reader."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Read from the inner stream, counting against the limit."""
        data = self.inner.read(len(buffer))
        self.seen += len(data)
        if self.seen >= self.limit:
            raise ValidationFailed(FIELD, f"{self.name}: the trace inflates to 2 GB or more, which gpufarm refuses")
        buffer[: len(data)] = data
        return len(data)


def check_size(path: Path) -> int:
    """The file's size, after refusing a missing file, a non-file and a file of MAX_TRACE_BYTES or more."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise ValidationFailed(FIELD, f"{path.name}: cannot read it ({exc.strerror or 'not found'})") from exc
    if not path.is_file():
        raise ValidationFailed(FIELD, f"{path.name}: not a file")
    if stat.st_size >= MAX_TRACE_BYTES:
        raise ValidationFailed(FIELD, f"{path.name}: {stat.st_size:,} bytes; gpufarm takes traces under 2 GB")
    if stat.st_size == 0:
        raise ValidationFailed(FIELD, f"{path.name}: empty file, not a trace")
    return stat.st_size


def is_gzip(path: Path) -> bool:
    """True when the file starts with gzip's magic bytes (the name's suffix is not trusted)."""
    with path.open("rb") as handle:
        return handle.read(2) == GZIP_MAGIC


def events(path: Path) -> Iterator[dict[str, Any]]:
    """Each span object of the trace's `traceEvents`, streamed; ValidationFailed when the file is no whole trace.

    The generator raises at the point the stream breaks (a truncated gzip, broken JSON), so a caller that reads it
    to the end before storing anything stores nothing from a bad file.
    """
    check_size(path)
    raw = path.open("rb")
    try:
        stream: IO[bytes] = cast("IO[bytes]", gzip.GzipFile(fileobj=raw, mode="rb")) if is_gzip(path) else raw
        bounded = io.BufferedReader(_Bounded(stream, MAX_TRACE_BYTES, path.name), buffer_size=1 << 20)
        found = False
        for event in ijson.items(bounded, "traceEvents.item", use_float=True):
            if not isinstance(event, dict):
                raise ValidationFailed(FIELD, f"{path.name}: traceEvents holds something other than events")
            found = True
            yield event
        if not found:
            raise ValidationFailed(FIELD, f"{path.name}: no traceEvents; not a torch.profiler Chrome trace")
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValidationFailed(FIELD, f"{path.name}: truncated or corrupt gzip ({_reason(exc)})") from exc
    except (ijson.JSONError, UnicodeDecodeError) as exc:
        # yajl's message quotes the text around the fault, which is the researcher's data: not repeated here.
        raise ValidationFailed(FIELD, f"{path.name}: not a whole JSON document (broken or cut short)") from exc
    finally:
        raw.close()


def _reason(exc: BaseException) -> str:
    """gzip's and zlib's own words on one short line (they name the fault, never the content)."""
    text = " ".join(str(exc).split())[:120]
    return text or type(exc).__name__
