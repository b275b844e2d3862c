"""The cached list prices (the `PriceBook` the rate card reads and the `PriceStore` the sync refreshes): one JSON
object (gpufarm.core.money.price_codec) in an S3 object or a file, named by GPUFARM_PRICE_CACHE.

- `s3://<bucket>/<key>`: in Lambda, the deployment's profile bucket under `rates/` (template.yaml): the sync writes
  it (s3:PutObject), every function that prices reads it (s3:GetObject); botocore retries each call within the
  deployment's bounds. An object not there yet is an empty cache: S3 answers NoSuchKey (404) only to a caller that
  may list the bucket (s3:ListBucket; the sync's role may), and AccessDenied (403) to the others until the first
  refresh wrote it.
- a file path: `gpufarm local`, an operator's machine; written whole through a temporary file and a rename.

Not lease state: losing it costs a refresh and leaves cloud pools unpriced until then, never a lease. Bounded:
MAX_CACHE_BYTES read at most, and the codec's MAX_PRICE_KEYS entries. A cache that is not one (corrupt,
truncated, another version) is ignored, with one warning per container, and the next refresh replaces it.

`known()` is what every use case reads: the cache read at most every MAX_AGE_S per container (a refresh writes it
at most every `rates.refresh_hours`), the last prices read kept when the store cannot be reached.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpufarm.adapters.aws import _client_error_code, _LazyClient
from gpufarm.config import ConfigurationError, Settings
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.money.card import CloudPrice, PriceKey
from gpufarm.core.money.price_codec import decode, encode
from gpufarm.core.money.prices import PriceState

log = logging.getLogger(__name__)

MAX_CACHE_BYTES = 1024 * 1024
MAX_AGE_S = 300.0
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_KEY_RE = re.compile(r"^[A-Za-z0-9!_.*'()/-]{1,512}$")


class _Backend:
    def read(self) -> bytes | None:
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        raise NotImplementedError


class _S3Object(_Backend):
    def __init__(self, bucket: str, key: str, settings: Settings, client: Any) -> None:
        self.bucket, self.key = bucket, key
        self._client = _LazyClient("s3", settings, client)

    def read(self) -> bytes | None:
        try:
            answer = self._client.get().get_object(Bucket=self.bucket, Key=self.key)
            with answer["Body"] as body:
                data: bytes = body.read(MAX_CACHE_BYTES + 1)
        except Exception as exc:  # noqa: BLE001 - botocore's errors and the connection's: the store failed
            code = _client_error_code(exc)
            if code in ("NoSuchKey", "404"):
                return None
            raise UpstreamError(f"reading the price cache s3://{self.bucket}/{self.key} failed: {code}") from None
        return data

    def write(self, data: bytes) -> None:
        try:
            self._client.get().put_object(Bucket=self.bucket, Key=self.key, Body=data, ContentType="application/json")
        except Exception as exc:  # noqa: BLE001 - botocore's errors and the connection's: the store failed
            code = _client_error_code(exc)
            raise UpstreamError(f"writing the price cache s3://{self.bucket}/{self.key} failed: {code}") from None


class _File(_Backend):
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> bytes | None:
        try:
            with self.path.open("rb") as handle:
                return handle.read(MAX_CACHE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UpstreamError(f"reading the price cache {self.path} failed: {type(exc).__name__}") from None

    def write(self, data: bytes) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".prices-", suffix=".tmp")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            Path(temporary).replace(self.path)
        except OSError as exc:
            raise UpstreamError(f"writing the price cache {self.path} failed: {type(exc).__name__}") from None


def backend(location: str, settings: Settings, client: Any = None) -> _Backend:
    """The store GPUFARM_PRICE_CACHE names: `s3://bucket/key` or a file path (ConfigurationError otherwise)."""
    text = location.strip()
    if text.startswith("s3://"):
        bucket, _, key = text.removeprefix("s3://").partition("/")
        if not _BUCKET_RE.match(bucket) or not _KEY_RE.match(key) or ".." in key:
            raise ConfigurationError("GPUFARM_PRICE_CACHE: not s3://<bucket>/<key>")
        return _S3Object(bucket, key, settings, client)
    if "://" in text or not text:
        raise ConfigurationError("GPUFARM_PRICE_CACHE: an s3://<bucket>/<key> or a file path")
    return _File(Path(text).expanduser())


class PriceCache:
    """PriceBook and PriceStore over one JSON object (see the module docstring)."""

    def __init__(
        self,
        location: str,
        settings: Settings | None = None,
        *,
        client: Any = None,
        max_age_s: float = MAX_AGE_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.location = location
        self._store = backend(location, settings or Settings(), client)
        self.max_age_s = max_age_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._known: tuple[float, dict[PriceKey, CloudPrice]] | None = None
        self._warned = False

    def known(self) -> Mapping[PriceKey, CloudPrice]:
        """The cached prices, read at most every max_age_s; the last read (or none) when the store fails."""
        with self._lock:
            held = self._known
        if held is not None and self._monotonic() - held[0] < self.max_age_s:
            return held[1]
        try:
            prices = self.load().known()
        except UpstreamError as exc:
            log.warning("list prices: %s; using those read before", exc)
            prices = held[1] if held is not None else {}
        with self._lock:
            self._known = (self._monotonic(), prices)
        return prices

    def load(self) -> PriceState:
        """The cache as saved; empty when there is none, or when it is not a cache (one warning)."""
        data = self._store.read()
        if data is None:
            return PriceState()
        if len(data) > MAX_CACHE_BYTES:
            return self._ignored(f"larger than {MAX_CACHE_BYTES} bytes")
        try:
            return decode(json.loads(data))
        except (ValueError, RecursionError) as exc:
            return self._ignored(str(exc))

    def _ignored(self, why: str) -> PriceState:
        if not self._warned:
            self._warned = True
            log.warning("the price cache %s is not a cache and is ignored: %s", self.location, why[:200])
        return PriceState()

    def save(self, state: PriceState) -> None:
        """Replace the cache (UpstreamError when the store refuses); what it holds is what `known` gives next."""
        data = json.dumps(encode(state), separators=(",", ":")).encode()
        if len(data) > MAX_CACHE_BYTES:
            raise UpstreamError(f"the price cache would be {len(data)} bytes; at most {MAX_CACHE_BYTES}")
        self._store.write(data)
        with self._lock:
            self._known = (self._monotonic(), state.known())
