"""The upload function's two steps: `begin` hands out where to put the traces, `complete` takes them in.

The caller holds only an upload token (gpufarm.core.kernel.upload_token), verified by the handler before either
step runs; both steps re-read the lease and apply `check_for_lease` (an ended lease, a user who left the team, a
token of another lease are refused), so a token is only as good as the lease is now.

- **begin**: the client states its runs (name, byte size, the file's name) and the batch size. Each run gets a
  presigned S3 PUT URL for one key under the lease's own incoming prefix (`incoming/ir-<n>/<upload-id>/…`), valid
  PUT_URL_S, and the upload gets a ticket (gpufarm.profiling.tickets) signed over the lease, the user, the keys and
  the sizes, so it names nothing the caller could change.
- **complete**: the ticket must be this token's (same lease, same user). Each incoming object must exist and be
  no larger than declared; it is copied to local storage and handed to the one upload mechanism
  (gpufarm.profiling.upload: analysed while streamed, stored, recorded through the pool's one writer, published),
  then deleted. So a ticket completed once finds nothing the second time, and the runs' keys derive from the
  ticket's start, which makes a second record of the same run the same command. Whatever refused the upload
  (a bad trace, an ended lease, an oversize object) deletes the incoming objects; a service failure keeps them,
  so `complete` can be tried again while the ticket lives.
"""

from __future__ import annotations

import logging
import secrets
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.kernel.errors import Conflict, GpufarmError, NotAllowed, UpstreamError, ValidationFailed
from gpufarm.core.kernel.upload_token import Claims
from gpufarm.core.leases import queries
from gpufarm.core.leases.upload_tokens import check_for_lease
from gpufarm.profiling import metrics, reader, tickets
from gpufarm.profiling.links import LinkSigner
from gpufarm.profiling.run_names import MAX_TRACES, NAME_RULE
from gpufarm.profiling.tickets import Ticket, TicketRun
from gpufarm.profiling.upload import MAX_BATCH_SIZE, ProfileStore, Uploaded, upload

log = logging.getLogger(__name__)

# A presigned PUT is good for this long: the upload starts at once (S3 checks the URL when the request begins).
PUT_URL_S = 15 * 60
# A ticket is good for this long (or until its token expires): long enough to send 2 GB on a slow link.
TICKET_S = 2 * 60 * 60
MAX_FILE_NAME = 100
_FILE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class TooLarge(ValidationFailed):
    """A trace larger than gpufarm takes, declared or uploaded (HTTP 413)."""


class Incoming(ProfileStore, Protocol):
    """The store's side for uploads in flight (gpufarm.adapters.profile_store.S3ProfileStore)."""

    def presign_put(self, key: str, expires_s: int) -> str:
        """A URL to PUT one object at `key` for `expires_s` seconds."""
        ...

    def incoming_size(self, key: str) -> int | None:
        """The uploaded object's size; None when there is none."""
        ...

    def download(self, key: str, target: Path, limit: int) -> int:
        """Copy the uploaded object to `target` (at most `limit` bytes); the bytes written."""
        ...

    def delete_incoming(self, key: str) -> None:
        """Remove an uploaded object."""
        ...


@dataclass(frozen=True)
class Begun:
    """What `begin` answers: the ticket, when it stops, and a PUT URL per run."""

    ticket: str
    expires: datetime
    urls: tuple[tuple[str, str], ...]  # (run, url)

    def body(self) -> dict[str, Any]:
        """The JSON answer."""
        return {
            "upload": self.ticket,
            "expires": int(self.expires.timestamp()),
            "put_expires_in": PUT_URL_S,
            "runs": [{"name": run, "url": url} for run, url in self.urls],
        }


@dataclass(frozen=True)
class Run:
    """One run the client states at `begin`."""

    name: str
    size: int
    file: str


def parse_begin(body: Mapping[str, Any]) -> tuple[int, list[Run], int | None]:
    """The lease, the runs and the batch size of a `begin` body; ValidationFailed (TooLarge for a size) otherwise."""
    ir = body.get("ir")
    if not isinstance(ir, int) or isinstance(ir, bool) or not 1 <= ir < tickets.MAX_IR:
        raise ValidationFailed("ir", "ir is the lease's number (123 for IR-123)")
    batch = body.get("batch_size")
    if batch is not None and (
        not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= MAX_BATCH_SIZE
    ):
        raise ValidationFailed("batch_size", f"a batch size is 1-{MAX_BATCH_SIZE:,}")
    raw = body.get("runs")
    if not isinstance(raw, list) or not raw:
        raise ValidationFailed("runs", "runs lists at least one trace")
    if len(raw) > MAX_TRACES:
        raise ValidationFailed("runs", f"at most {MAX_TRACES} traces per upload")
    runs = [_run(item) for item in raw]
    if len({run.name for run in runs}) != len(runs):
        raise ValidationFailed("name", "each run of an upload has its own name")
    return ir, runs, batch


def _run(item: Any) -> Run:
    if not isinstance(item, Mapping):
        raise ValidationFailed("runs", "each run is an object with name, bytes and file")
    name, size, file = item.get("name"), item.get("bytes"), item.get("file", "trace.json")
    if not isinstance(name, str) or not metrics.valid_run_name(name):
        raise ValidationFailed("name", NAME_RULE)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValidationFailed("bytes", "bytes is the trace file's size")
    if size >= reader.MAX_TRACE_BYTES:
        raise TooLarge("bytes", f"{name}: {size:,} bytes; gpufarm takes traces under 2 GB")
    if not isinstance(file, str) or not 1 <= len(file) <= MAX_FILE_NAME or not set(file) <= _FILE_CHARS:
        raise ValidationFailed("file", f"a file name is 1-{MAX_FILE_NAME} of letters, digits, '.', '_', '-'")
    return Run(name, size, file)


def begin(
    ctx: LeaseContext, store: Incoming, claims: Claims, *, key: bytes, ir: int, runs: Sequence[Run], batch: int | None
) -> Begun:
    """Check the token holds for lease `ir` now; sign a ticket and a PUT URL per run."""
    _holds(ctx, claims, ir)
    now = ctx.now()
    upload_id = secrets.token_hex(16)
    ticket = Ticket(
        ir=ir,
        user=claims.user,
        upload_id=upload_id,
        issued=now,
        expires=min(now + timedelta(seconds=TICKET_S), claims.expires),
        batch_size=batch,
        runs=tuple(
            TicketRun(run.name, tickets.incoming_key(ir, upload_id, i, run.name), run.size, run.file)
            for i, run in enumerate(runs)
        ),
    )
    text = tickets.mint(ticket, key)
    urls = tuple((run.name, store.presign_put(run.key, PUT_URL_S)) for run in ticket.runs)
    log.info("upload %s begun on IR-%d by %s: %d run(s)", upload_id, ir, claims.user, len(runs))
    return Begun(text, ticket.expires, urls)


def complete(
    ctx: LeaseContext,
    store: Incoming,
    signer: LinkSigner,
    claims: Claims,
    *,
    key: bytes,
    ticket_text: Any,
    pages_url: str,
    retention_days: int,
) -> list[Uploaded]:
    """Take the uploaded traces in: checked, analysed, stored, recorded, then deleted from incoming/."""
    ticket = tickets.verify(ticket_text, key, ctx.now())
    if ticket.ir != claims.ir or ticket.user != claims.user:
        raise NotAllowed("this upload was begun with another upload token")
    try:
        _holds(ctx, claims, ticket.ir)
        sizes = [store.incoming_size(run.key) for run in ticket.runs]
        missing = [run.name for run, size in zip(ticket.runs, sizes, strict=True) if size is None]
        if missing:
            # A replay of a completed ticket lands here: its objects are gone, so nothing is recorded twice.
            raise Conflict(f"nothing was uploaded for run {missing[0]}, or this upload was completed already")
        for run, size in zip(ticket.runs, sizes, strict=True):
            assert size is not None
            if size > run.size:
                raise TooLarge("trace", f"{run.name}: {size:,} bytes uploaded, {run.size:,} declared")
        return _take_in(ctx, store, signer, ticket, pages_url=pages_url, retention_days=retention_days)
    except UpstreamError:
        raise  # kept: complete may be tried again
    except GpufarmError:
        _forget(store, ticket)
        raise


def _take_in(
    ctx: LeaseContext, store: Incoming, signer: LinkSigner, ticket: Ticket, *, pages_url: str, retention_days: int
) -> list[Uploaded]:
    with tempfile.TemporaryDirectory(prefix="gpufarm-intake-") as work:
        paths = []
        for i, run in enumerate(ticket.runs):
            path = Path(work) / f"{i}.trace"
            try:
                store.download(run.key, path, run.size)
            except ValueError:
                raise TooLarge("trace", f"{run.name}: larger than {run.size:,} bytes declared") from None
            paths.append(path)
        done = upload(
            ctx,
            store,
            signer,
            pages_url=pages_url,
            retention_days=retention_days,
            ir=ticket.ir,
            actor=ticket.user,
            paths=paths,
            names=[run.name for run in ticket.runs],
            file_names=[run.file for run in ticket.runs],
            batch_size=ticket.batch_size,
            at=ticket.issued,
        )
    _forget(store, ticket)
    log.info("upload %s completed on IR-%d: %d run(s)", ticket.upload_id, ticket.ir, len(done))
    return done


def _holds(ctx: LeaseContext, claims: Claims, ir: int) -> None:
    """The token is for lease `ir`, and holds for it now (NotAllowed, Conflict: upload_tokens.check_for_lease)."""
    if claims.ir != ir:
        raise NotAllowed(f"the upload token is not for IR-{ir}")
    check_for_lease(claims, queries.allocation(ctx, ir), ctx.membership())


def _forget(store: Incoming, ticket: Ticket) -> None:
    for run in ticket.runs:
        store.delete_incoming(run.key)
