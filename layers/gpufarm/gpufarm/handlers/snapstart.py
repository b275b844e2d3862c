"""SnapStart runtime hooks: work done once before Lambda snapshots a published version, and undone after a restore.

With SnapStart (template.yaml: SlackIngressFunction), Lambda runs a version's init phase when the version is
published, snapshots the microVM, and starts later cold containers from that snapshot. Hooks registered here run
in that init phase (before the snapshot) and in every restored container before its first request:
- before the snapshot: whatever the first request would otherwise pay that holds no secret and no connection:
  the AWS clients (botocore session, service models, endpoint rules), lazily imported modules, pydantic
  validators, and the farm (configuration, not a secret) read and parsed. No secret is read: the snapshot must
  hold none. No parameter value stays cached either: values read then could be days old when a container is
  restored, so the farm is read again after the restore, with the secrets in the same call, and parsed again
  only when its text changed (gpufarm.handlers.runtime.parsed_farm).
- after a restore: drop anything cached that may have gone stale (configuration values, the runtime built from
  them), close pooled connections (their sockets did not survive the snapshot), and reseed `random` (every
  container restored from one snapshot would otherwise draw the same retry jitter).

The hooks go to `snapshot_restore_py`, which Lambda's Python managed runtimes include; where it is absent (tests,
benchmarks, the local host) they are kept here, and run_before_snapshot / run_after_restore run them the same way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Hook = Callable[[], None]

_lock = threading.Lock()
_before: list[Hook] = []
_after: list[Hook] = []
_registered_with_runtime = False


def register(*, before_snapshot: Hook | None = None, after_restore: Hook | None = None) -> None:
    """Add hooks (idempotent per function); the first call also hands the dispatchers to the Lambda runtime."""
    global _registered_with_runtime  # noqa: PLW0603 - one registration per process
    with _lock:
        if before_snapshot is not None and before_snapshot not in _before:
            _before.append(before_snapshot)
        if after_restore is not None and after_restore not in _after:
            _after.append(after_restore)
        if _registered_with_runtime:
            return
        _registered_with_runtime = True
    try:
        from snapshot_restore_py import (  # type: ignore[import-not-found, unused-ignore]
            register_after_restore,
            register_before_snapshot,
        )
    except ImportError:
        return
    register_before_snapshot(run_before_snapshot)
    register_after_restore(run_after_restore)


def run_before_snapshot() -> None:
    """Run the before-snapshot hooks, in the order they were registered."""
    with _lock:
        hooks = tuple(_before)
    for hook in hooks:
        hook()


def run_after_restore() -> None:
    """Run the after-restore hooks, in the order they were registered."""
    with _lock:
        hooks = tuple(_after)
    for hook in hooks:
        hook()
    log.info("restored from a SnapStart snapshot: %d hook(s) ran", len(hooks))
