"""The S3 bucket of profiler runs: each run's trace (gzipped) and summary data, under `profiles/<key>/`.

A run is stored whole or not at all: the trace goes first, then its summary (the figures as JSON,
gpufarm.profiling.summary; never HTML: the pages function renders the page itself); when the summary cannot be
stored the trace is deleted again, so the incident (written only after both are stored) never links to half a run.
The pages function reads at most summary.MAX_BYTES + 1 bytes of a summary, whatever is stored there.
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

    def _failed(self, what: str, exc: Exception) -> UpstreamError:
        return UpstreamError(
            f"S3 did not store {what} after {self.attempts} attempts ({_client_error_code(exc)}); "
            "nothing was recorded in the incident, upload again"
        )
