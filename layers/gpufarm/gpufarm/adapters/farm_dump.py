"""The farm's compact, already-validated form on a command-line machine: `gpufarm report`'s fast path.

The farm YAML is validated by its pydantic models (gpufarm.core.config.farm.parse_farm) the first time a command
reads a given text; the validated model's JSON dump is then kept in the user's cache directory under a name made of
the SHA-256 of that text and of the code that validates it (the farm's models, pydantic's version). A later command
reading the same text with the same code loads the dump into a FarmView (gpufarm.core.config.farm_view) and imports
neither pydantic nor the models; any other text, or a code change, is validated again. A dump that cannot be read or
is not the expected shape is validated again too, and a cache that cannot be written costs only the speed.

Why: importing pydantic and building the farm's models was 0.05-0.15 s of CPU and about 7 MB of each
`gpufarm report` (benchmarks/RESULTS.md, "Reports"); the dump loads in about a millisecond.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path

from gpufarm.core.config.farm_view import FarmDumpMismatch, FarmView

# Whose code decides what a valid farm is: the farm's sections and the kernel's names and bounds they use.
_VALIDATING_MODULES = ("gpufarm.core.config", "gpufarm.core.kernel.model")
# A dump larger than this is not one gpufarm wrote (a farm file is bounded well below it).
MAX_DUMP_BYTES = 8 * 1024 * 1024


def farm_view(text: str, cache: Path | None = None) -> FarmView:
    """The validated farm in `text` as a FarmView: from its kept dump when there is one for this text and code,
    otherwise validated (FarmConfigError when invalid: nothing is kept) and its dump kept."""
    directory = cache if cache is not None else cache_directory()
    path = directory / f"farm-{dump_key(text)}.json"
    view = _kept(path)
    if view is not None:
        return view
    from gpufarm.core.config.farm import parse_farm

    dump = parse_farm(text).model_dump(mode="json")
    _keep(path, dump)
    return FarmView.from_dump(dump)


def cache_directory() -> Path:
    """gpufarm's directory in the user's cache: $XDG_CACHE_HOME/gpufarm, or ~/.cache/gpufarm."""
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".cache") / "gpufarm"


def dump_key(text: str) -> str:
    """SHA-256 of the farm text and of the code that validates it."""
    digest = hashlib.sha256(validating_code())
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


@functools.cache
def validating_code() -> bytes:
    """A digest of the sources that decide what a valid farm is (gpufarm's and pydantic's version)."""
    digest = hashlib.sha256()
    files: list[Path] = []
    for name in _VALIDATING_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)
        files += sorted(origin.parent.glob("*.py")) if origin.name == "__init__.py" else [origin]
    pydantic = importlib.util.find_spec("pydantic")
    if pydantic is not None and pydantic.origin is not None:
        files.append(Path(pydantic.origin).parent / "version.py")
    for file in files:
        digest.update(file.name.encode())
        digest.update(file.read_bytes())
    return digest.digest()


def _kept(path: Path) -> FarmView | None:
    try:
        with path.open("rb") as kept:
            data = kept.read(MAX_DUMP_BYTES + 1)
        if len(data) > MAX_DUMP_BYTES:
            return None
        return FarmView.from_dump(json.loads(data))
    except (OSError, ValueError, FarmDumpMismatch):
        return None


def _keep(path: Path, dump: object) -> None:
    """Write the dump beside no one else's: a private directory, a temporary file renamed into place."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".farm-", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(dump, out, separators=(",", ":"))
            Path(temporary).replace(path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError:
        return
