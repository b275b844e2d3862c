"""Slurm through `scontrol`: read reservations and nodes, apply one reservation operation, each call bounded.

Every `scontrol create/update/delete reservation` is one request to slurmctld, applied whole or not at all; a
failed one leaves the others as they are and is retried on the next run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

DEFAULT_TIMEOUT = 15.0
# What scontrol answers when asked to delete a reservation that is not there: the goal is reached.
_GONE = "Requested reservation is invalid"
_MAX_ERROR = 300


class ScontrolError(RuntimeError):
    """scontrol failed, timed out or is missing; the message is its own (bounded), never a secret."""


class Scontrol:
    """`scontrol` run as a subprocess with a timeout, in the environment given (SLURM_CONF)."""

    def __init__(
        self, binary: str = "scontrol", *, timeout: float = DEFAULT_TIMEOUT, env: Mapping[str, str] | None = None
    ) -> None:
        self.binary = binary
        self.timeout = timeout
        self._env = dict(os.environ if env is None else env)

    def available(self) -> bool:
        """True when the binary can be found."""
        return shutil.which(self.binary, path=self._env.get("PATH")) is not None

    def call(self, args: Sequence[str]) -> str:
        """scontrol's standard output; ScontrolError on a non-zero exit, a timeout or a missing binary."""
        try:
            done = subprocess.run(  # noqa: S603 - a fixed binary, arguments built by gpufarm, no shell
                [self.binary, *args],
                capture_output=True,
                text=True,
                timeout=self.timeout,
                env=self._env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ScontrolError(f"scontrol {args[0]} timed out after {self.timeout:.0f}s") from None
        except OSError as exc:
            raise ScontrolError(f"cannot run {self.binary}: {exc.strerror}") from None
        if done.returncode != 0:
            why = " ".join((done.stderr or done.stdout or "").split())[:_MAX_ERROR]
            raise ScontrolError(f"scontrol {' '.join(args[:2])} failed ({done.returncode}): {why}")
        return done.stdout

    def reservations(self) -> str:
        """`scontrol show reservation --oneliner`."""
        return self.call(["show", "reservation", "--oneliner"])

    def nodes(self) -> str:
        """`scontrol show node --oneliner`."""
        return self.call(["show", "node", "--oneliner"])

    def apply(self, args: Sequence[str]) -> None:
        """One reservation operation; deleting one already gone counts as done."""
        try:
            self.call(args)
        except ScontrolError as exc:
            if args and args[0] == "delete" and _GONE in str(exc):
                return
            raise
