"""Bounded, streaming reading of the Chrome-trace JSON that `torch.profiler` exports (gzipped or not).

A trace is one JSON object whose `traceEvents` array holds every span; a training run's trace is easily a few
hundred megabytes. Loading that with `json.load` costs several times its size in Python objects (a 200 MB trace
needs well over 1 GB), so the events are streamed one at a time with ijson's C backend and never held whole.

Bounds, checked before anything is stored: the file's size is read from the file system first (at least
MAX_TRACE_BYTES is refused unread), a gzipped file stops once its inflated text passes the same limit (a small
file that inflates to terabytes is refused too), a truncated gzip or JSON stream is an error, and a JSON document
without a `traceEvents` array of span objects is "not a trace". Every refusal is a ValidationFailed whose message
is safe to show (it names the file, never its content).

Per-event bounds (_Scan, on the bytes before the parser sees them): nesting deeper than MAX_DEPTH, a string longer
than MAX_STRING_BYTES, one event (any value nested below the document's top two levels) longer than
MAX_EVENT_BYTES, and more than MAX_VALUES values in the document are refused, as are more than MAX_EVENTS events.
Why before the parser: ijson builds a prefix string per nesting level, so a trace nested 200,000 deep costs
memory quadratic in its depth, and yajl buffers a whole string, so one 200 MB string took minutes; the scan
stops both within the first megabyte past the bound, in C-speed byte operations (escapes neutralised, then only
quotes, brackets and commas kept, the strings among them removed).
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from array import array
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path
from typing import IO, Any, cast

import ijson

from gpufarm.core.kernel.errors import ValidationFailed

# "A trace of 2 GB" is refused: what torch.profiler writes for one profiled window is far below this.
MAX_TRACE_BYTES = 2 * 10**9
GZIP_MAGIC = b"\x1f\x8b"
FIELD = "trace"
# torch.profiler nests 4 levels (document, traceEvents, an event, its args) and a list in args makes 5.
MAX_DEPTH = 16
# Kernel and operator names, even templated C++ ones, and a "Call stack" argument are kilobytes.
MAX_STRING_BYTES = 1 << 20
# One event is a few hundred bytes; its args with input shapes a few kilobytes.
MAX_EVENT_BYTES = 4 << 20
# A 200 MB trace holds about 655,000 events (benchmarks/RESULTS.md, "Profiler runs") of about 19 values each;
# either bound is about 600 MB of profiler output, past which a trace is refused rather than analysed for minutes.
# The values bound is what stops a flood of tiny values the parser skips (under another key than traceEvents).
MAX_EVENTS = 2_000_000
MAX_VALUES = 32_000_000
# The parser reads in pieces of at most this, so a string wholly inside one piece is within MAX_STRING_BYTES.
_PIECE = MAX_STRING_BYTES
# An escape (a backslash and the byte it escapes) becomes two neutral bytes, so every quote left delimits a string
# and every position stays where it was. Escapes go first because a pattern that matches strings with their
# escapes retries at each escaped quote of a string that runs past the piece: quadratic in its escapes.
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_NOT_SIGNS = bytes(b for b in range(256) if b not in b'[]{},"')
# An opening bracket becomes +1, a closing one -1 (as a signed byte).
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_EVENT_DEPTH = 3  # the document is depth 1, its top-level arrays 2, an event 3


class _Bounded(io.RawIOBase):
    """A reader that fails once more than `limit` bytes came through (bounds what a gzip stream inflates to)."""

    def __init__(self, inner: IO[bytes], limit: int, name: str) -> None:
        self.inner = inner
        self.limit = limit
        self.name = name
        self.seen = 0
        self.scan = _Scan(name)

    def readable(self) -> bool:
        """Always: this wraps a reader."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Read from the inner stream, counting against the limit."""
        data = self.inner.read(min(len(buffer), _PIECE))
        self.seen += len(data)
        if self.seen >= self.limit:
            raise ValidationFailed(FIELD, f"{self.name}: the trace inflates to 2 GB or more, which gpufarm refuses")
        self.scan.feed(data)
        buffer[: len(data)] = data
        return len(data)


class _Scan:
    """The per-event bounds, checked on each piece of the JSON text before the parser reads it.

    It keeps only where the text is: the bracket depth, whether it is inside a string (and how long that string is
    so far, and whether a backslash ends the piece), how many bytes have passed since the text was last outside
    an event, and how many values it has seen. Invalid JSON may fool it, but only past the point where the
    parser, which reads no further than the scan, stops at the fault.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.depth = 0
        self.in_string = False
        self.string_bytes = 0
        self.escaped = False
        self.deep_bytes = 0
        self.values = 0

    def feed(self, data: bytes) -> None:
        """Account one piece of the text (at most _PIECE bytes); ValidationFailed at the first bound it breaks."""
        skip = 1 if self.escaped and data else 0  # the byte a backslash ending the last piece escapes
        flat = _ESCAPE.sub(b"__", data[skip:] if skip else data)
        self.escaped = False
        self._grow_string(skip)
        if self.in_string:
            close = flat.find(b'"')
            if close < 0:
                self._grow_string(len(flat))
                self.escaped = flat.endswith(b"\\")
                self._deep(len(data))
                return
            self._grow_string(close)
            self.in_string, flat = False, flat[close + 1 :]
        if flat.count(b'"') % 2:
            # The last quote opens a string that goes on into the next piece.
            opening = flat.rfind(b'"')
            self.in_string, self.string_bytes = True, 0
            self._grow_string(len(flat) - opening - 1)
            self.escaped = flat.endswith(b"\\")
            flat = flat[:opening]
        self._structure(flat, len(data))

    def _structure(self, flat: bytes, size: int) -> None:
        """Count the values and follow the nesting of a piece whose strings all close within it."""
        # Only quotes, brackets and commas matter. Two quotes with nothing between them go in one C-speed replace
        # (an empty string, or the seam of two strings: either way the text outside strings stays the same); only
        # strings holding brackets or commas are left for the regular expression.
        signs = flat.translate(None, _NOT_SIGNS).replace(b'""', b"")
        if b'"' in signs:
            signs = _STRING.sub(b"", signs)
        self.values += signs.count(b",")
        if self.values > MAX_VALUES:
            self._refuse(f"more than {MAX_VALUES:,} values")
        self._nest(signs.translate(_STEPS, _NOT_BRACKETS), size)

    def _grow_string(self, size: int) -> None:
        self.string_bytes += size
        if self.string_bytes > MAX_STRING_BYTES:
            self._refuse(f"a string longer than {MAX_STRING_BYTES:,} bytes")

    def _nest(self, steps: bytes, size: int) -> None:
        """Follow the depth through the piece's brackets; refuse past MAX_DEPTH or one event past its bound.

        Each round removes every innermost bracket pair, so the rounds are how deep the piece's closed groups go
        and what is left is the unmatched closers then openers: the depth never drops below where those closers
        take it, and never rises above the higher end plus the rounds. A trace nests 4-5 levels, so this costs a
        few byte replacements a piece; only past the cheap bound is the depth followed bracket by bracket.
        """
        left, rounds = steps, 0
        while rounds <= MAX_DEPTH:
            reduced = left.replace(b"\x01\xff", b"")
            if len(reduced) == len(left):
                break
            left, rounds = reduced, rounds + 1
        closers = len(left) - len(left.lstrip(b"\xff"))
        end = self.depth - closers + (len(left) - closers)
        if max(self.depth, end) + rounds > MAX_DEPTH and _deepest(steps, self.depth) > MAX_DEPTH:
            self._refuse(f"nested deeper than {MAX_DEPTH} levels")
        lowest = self.depth - closers
        self.depth = end
        if lowest < _EVENT_DEPTH:
            self.deep_bytes = 0  # an event ended (or none began) in this piece
        else:
            self._deep(size)

    def _deep(self, size: int) -> None:
        if self.depth < _EVENT_DEPTH:
            self.deep_bytes = 0
            return
        self.deep_bytes += size
        if self.deep_bytes > MAX_EVENT_BYTES:
            self._refuse(f"an event longer than {MAX_EVENT_BYTES:,} bytes")

    def _refuse(self, what: str) -> None:
        raise ValidationFailed(FIELD, f"{self.name}: {what}, which gpufarm refuses in a trace")


def _deepest(steps: bytes, depth: int) -> int:
    """The deepest level the +1/-1 steps reach from `depth`, followed one by one (only past the cheap bound)."""
    return max(accumulate(array("b", steps), initial=depth))


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
        count = 0
        for event in ijson.items(bounded, "traceEvents.item", use_float=True):
            if not isinstance(event, dict):
                raise ValidationFailed(FIELD, f"{path.name}: traceEvents holds something other than events")
            count += 1
            if count > MAX_EVENTS:
                raise ValidationFailed(FIELD, f"{path.name}: more than {MAX_EVENTS:,} events, which gpufarm refuses")
            yield event
        if not count:
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
