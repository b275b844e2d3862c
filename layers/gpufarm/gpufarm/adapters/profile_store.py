"""The S3 bucket of profiler runs: each run's trace (gzipped) and summary data, under `profiles/<key>/`.

A run is stored whole or not at all: the trace goes first, then its summary (the figures as JSON,
gpufarm.profiling.summary; never HTML: the pages function renders the page itself); when the summary cannot be
stored the trace is deleted again, so the incident (written only after both are stored) never links to half a run.
The pages function reads at most summary.MAX_BYTES + 1 bytes of a summary, whatever is stored there.
Uploads arrive under `incoming/ir-<n>/<upload-id>/` (gpufarm.profiling.tickets) through presigned PUT URLs this
store signs for the upload function; only that function reads them, analyses them and deletes them (the bucket's
lifecycle rule expires what an abandoned upload leaves after a day).
Each call is retried by botocore within the deployment's bounds (standard mode: throttling, 5xx and connection
errors, GPUFARM_MAX_RETRIES + 1 attempts); what still fails is an UpstreamError saying which object and how
often it was tried. The bucket's encryption, lifecycle and public-access block are template.yaml's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gpufarm.adapters.aws import _client_error_code, _LazyClient
from gpufarm.config import Settings
from gpufarm.core.kernel.errors import NotFound, UpstreamError
from gpufarm.profiling import summary as run_summary
from gpufarm.profiling.links import checked_key

log = logging.getLogger(__name__)

PREFIX = "profiles/"
INCOMING = "incoming/"
_CHUNK = 1 << 20
TRACE = "trace.json.gz"
SUMMARY = "summary.json"


class S3ProfileStore:
    """Profiler runs in one S3 bucket."""

    def __init__(self, settings: Settings, bucket: str, *, client: Any = None) -> None:
        self.bucket = bucket
        self.attempts = settings.max_retries + 1
        self._client = _LazyClient("s3", settings, client)

    def put_run(self, key: str, trace_gz: Path, summary: bytes, latest: str | None = None) -> None:
        """Store a run's gzipped trace and its summary data (and the summary as `latest`, its team's newest run);
        UpstreamError, nothing of this run left stored, when S3 fails."""
        folder = PREFIX + checked_key(key) + "/"
        client = self._client.get()
        try:
            with trace_gz.open("rb") as body:
                client.put_object(
                    Bucket=self.bucket,
                    Key=folder + TRACE,
                    Body=body,
                    ContentType="application/json",
                    ContentEncoding="gzip",
                )
        except Exception as exc:
            raise self._failed("the trace", exc) from exc
        try:
            client.put_object(
                Bucket=self.bucket,
                Key=folder + SUMMARY,
                Body=summary,
                ContentType="application/json",
            )
        except Exception as exc:
            self._forget(folder + TRACE)
            raise self._failed("the run's summary", exc) from exc
        if latest is None:
            return
        try:
            client.put_object(
                Bucket=self.bucket,
                Key=PREFIX + checked_key(latest) + "/" + SUMMARY,
                Body=summary,
                ContentType="application/json",
            )
        except Exception as exc:
            self._forget(folder + SUMMARY)
            self._forget(folder + TRACE)
            raise self._failed("the team's newest-run summary", exc) from exc

    def delete_run(self, key: str) -> None:
        """Remove a stored run (its trace and summary): a run whose lease ended before it was recorded."""
        folder = PREFIX + checked_key(key) + "/"
        self._forget(folder + TRACE)
        self._forget(folder + SUMMARY)

    def presign_put(self, key: str, expires_s: int) -> str:
        """A URL that lets its holder PUT one object at `key` (under incoming/ only) for `expires_s` seconds.

        S3 checks the signature over the method, the bucket and the key, so the URL stores nothing anywhere else.
        """
        client = self._client.get()
        url: str = client.generate_presigned_url(
            "put_object", Params={"Bucket": self.bucket, "Key": _incoming(key)}, ExpiresIn=expires_s
        )
        return url

    def incoming_size(self, key: str) -> int | None:
        """The uploaded object's size, or None when there is none (never uploaded, or completed already)."""
        client = self._client.get()
        try:
            answer = client.head_object(Bucket=self.bucket, Key=_incoming(key))
        except Exception as exc:
            if _client_error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._failed_read("an uploaded trace", exc) from exc
        return int(answer["ContentLength"])

    def download(self, key: str, target: Path, limit: int) -> int:
        """Copy the uploaded object to `target`, streamed a megabyte at a time; at most `limit` bytes are written
        (ValueError past it: the object grew after it was measured). Returns the bytes written."""
        client = self._client.get()
        try:
            body = client.get_object(Bucket=self.bucket, Key=_incoming(key))["Body"]
        except Exception as exc:
            raise self._failed_read("an uploaded trace", exc) from exc
        try:
            return _copy(body, target, limit)
        except ValueError:
            raise
        except Exception as exc:
            raise self._failed_read("an uploaded trace", exc) from exc
        finally:
            body.close()

    def delete_incoming(self, key: str) -> None:
        """Remove an uploaded object (analysed, refused, or its lease ended); a failure is logged, the lifecycle
        rule removes it within a day."""
        self._forget(_incoming(key))

    def summary(self, key: str) -> bytes:
        """A run's stored summary data, unchecked (gpufarm.profiling.summary.parse checks it): at most
        summary.MAX_BYTES + 1 bytes of it are read, so parse refuses an oversize object without reading it all.
        NotFound when there is none (expired by the lifecycle rule, never stored, or stored before summaries
        replaced pages)."""
        folder = PREFIX + checked_key(key) + "/"
        client = self._client.get()
        try:
            answer = client.get_object(Bucket=self.bucket, Key=folder + SUMMARY)
        except Exception as exc:
            if _client_error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                raise NotFound("no such profiler run (runs are kept for the farm's retention)") from exc
            raise self._failed("the run's summary", exc) from exc
        body = answer["Body"]
        try:
            return bytes(body.read(run_summary.MAX_BYTES + 1))
        finally:
            body.close()

    def _forget(self, key: str) -> None:
        try:
            self._client.get().delete_object(Bucket=self.bucket, Key=key)
        except Exception as exc:  # noqa: BLE001 - the lifecycle rule removes an orphan; the upload already failed
            log.warning("could not delete %s after a failed upload: %s", key, _client_error_code(exc))

    def _failed_read(self, what: str, exc: Exception) -> UpstreamError:
        return UpstreamError(f"S3 did not give {what} after {self.attempts} attempts ({_client_error_code(exc)})")

    def _failed(self, what: str, exc: Exception) -> UpstreamError:
        return UpstreamError(
            f"S3 did not store {what} after {self.attempts} attempts ({_client_error_code(exc)}); "
            "nothing was recorded in the incident, upload again"
        )


def _copy(body: Any, target: Path, limit: int) -> int:
    """Write the streamed body to `target`, a megabyte at a time; ValueError past `limit` bytes."""
    written = 0
    with target.open("wb") as out:
        while chunk := body.read(_CHUNK):
            written += len(chunk)
            if written > limit:
                raise ValueError("the uploaded object is larger than was measured")
            out.write(chunk)
    return written


def _incoming(key: str) -> str:
    if not key.startswith(INCOMING) or ".." in key or len(key) > 300:
        raise ValueError("an upload's key is under incoming/")
    return key
