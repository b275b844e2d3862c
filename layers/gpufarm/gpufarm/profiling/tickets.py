"""Upload tickets: what the upload function's `begin` promised, signed so `complete` can trust it coming back.

A ticket is `gft1.<payload>.<signature>`: the payload is compact JSON in unpadded base64url naming the lease (IR),
the user the upload token was given to, the upload's id, when it began and until when it may be completed, the
batch size, and each run (its name, its object key under the lease's own incoming prefix, the byte size the
client declared and the file's name its page shows). The signature is HMAC-SHA256 under the deployment's
`upload_token_secret`, over a label of its own, the version and the payload, so a ticket is never mistaken for an
upload token (nor one for the other) and cannot be edited to name another lease, user or key. Verification bounds
the text before decoding it, compares the signature in constant time before parsing, and checks every field
against what `begin` could have written. Every refusal is one InvalidTicket naming the kind of failure, never the
ticket.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpufarm.core.kernel.errors import NotAllowed

VERSION = "gft1"
_LABEL = b"gpufarm upload ticket\x00"
# 16 runs of a 63-character name and a key of about 110 characters, with their sizes: about 4 kB as base64.
MAX_TICKET_CHARS = 8192
MAX_RUNS = 16
MAX_IR = 10**9
MAX_BYTES = 2 * 10**9
MAX_BATCH_SIZE = 1_000_000
_SIGNATURE_CHARS = 43
_B64URL = re.compile(r"[A-Za-z0-9_-]+")
_USER = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ID = re.compile(r"[0-9a-f]{32}")
_RUN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
_FILE = re.compile(r"[A-Za-z0-9._-]{1,100}")
INCOMING = "incoming/"


class InvalidTicket(NotAllowed):
    """A ticket that is forged, expired, malformed or oversize: the caller is not authorised (HTTP 401)."""


@dataclass(frozen=True)
class TicketRun:
    """One run an upload carries: its name, the incoming object's key and the size the client declared."""

    name: str
    key: str
    size: int
    file: str


@dataclass(frozen=True)
class Ticket:
    """One upload between `begin` and `complete`."""

    ir: int
    user: str
    upload_id: str
    issued: datetime
    expires: datetime
    batch_size: int | None
    runs: tuple[TicketRun, ...]


def incoming_prefix(ir: int, upload_id: str) -> str:
    """Where one upload's objects wait for `complete`: under its lease's own prefix, then the upload's id."""
    return f"{INCOMING}ir-{ir}/{upload_id}/"


def incoming_key(ir: int, upload_id: str, index: int, run: str) -> str:
    """The incoming object of the upload's `index`th run."""
    return f"{incoming_prefix(ir, upload_id)}{index}-{run}"


def mint(ticket: Ticket, key: bytes) -> str:
    """The signed ticket text (the fields are gpufarm's own, so they are checked as its mistakes: ValueError)."""
    _check(ticket)
    body = {
        "ir": ticket.ir,
        "user": ticket.user,
        "id": ticket.upload_id,
        "at": int(ticket.issued.timestamp()),
        "exp": int(ticket.expires.timestamp()),
        "batch": ticket.batch_size,
        "runs": [[run.name, run.key, run.size, run.file] for run in ticket.runs],
    }
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    return f"{VERSION}.{payload}.{_b64(_sign(key, payload))}"


def verify(text: str, key: bytes, now: datetime) -> Ticket:
    """The ticket `mint` made under `key`, when it has not expired at `now`; InvalidTicket otherwise."""
    if not isinstance(text, str) or len(text) > MAX_TICKET_CHARS:
        raise InvalidTicket("the upload ticket is malformed")
    parts = text.split(".")
    if len(parts) != 3 or parts[0] != VERSION:
        raise InvalidTicket("the upload ticket is malformed")
    payload, signature = parts[1], parts[2]
    if not _B64URL.fullmatch(payload) or not _B64URL.fullmatch(signature) or len(signature) != _SIGNATURE_CHARS:
        raise InvalidTicket("the upload ticket is malformed")
    if not hmac.compare_digest(_b64(_sign(key, payload)), signature):
        raise InvalidTicket("the upload ticket is not gpufarm's")
    ticket = _parse(payload)
    if now >= ticket.expires:
        raise InvalidTicket("the upload ticket has expired; upload again")
    return ticket


def _parse(payload: str) -> Ticket:
    try:
        body: Any = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        ticket = Ticket(
            ir=body["ir"],
            user=body["user"],
            upload_id=body["id"],
            issued=datetime.fromtimestamp(_int(body["at"]), UTC),
            expires=datetime.fromtimestamp(_int(body["exp"]), UTC),
            batch_size=body["batch"],
            runs=tuple(TicketRun(name=r[0], key=r[1], size=r[2], file=r[3]) for r in body["runs"]),
        )
        _check(ticket)
    except (binascii.Error, UnicodeDecodeError, ValueError, KeyError, IndexError, TypeError, OverflowError):
        raise InvalidTicket("the upload ticket is malformed") from None
    return ticket


def _int(value: Any) -> int:
    if not _whole(value, 1, 10**11 - 1):
        raise ValueError("not an epoch")
    return int(value)


def _check(ticket: Ticket) -> None:
    """ValueError unless every field is one `begin` could have written."""
    if not _whole(ticket.ir, 1, MAX_IR - 1):
        raise ValueError("the ticket's IR is out of range")
    if not isinstance(ticket.user, str) or not _USER.fullmatch(ticket.user):
        raise ValueError("the ticket's user is not a Slack user id")
    if not isinstance(ticket.upload_id, str) or not _ID.fullmatch(ticket.upload_id):
        raise ValueError("the ticket's upload id is malformed")
    if ticket.batch_size is not None and not _whole(ticket.batch_size, 1, MAX_BATCH_SIZE):
        raise ValueError("the ticket's batch size is out of range")
    if not 1 <= len(ticket.runs) <= MAX_RUNS:
        raise ValueError("the ticket holds no runs or too many")
    for index, run in enumerate(ticket.runs):
        _check_run(ticket, index, run)
    if len({run.name for run in ticket.runs}) != len(ticket.runs):
        raise ValueError("the ticket names a run twice")


def _check_run(ticket: Ticket, index: int, run: TicketRun) -> None:
    if not isinstance(run.name, str) or not _RUN.fullmatch(run.name):
        raise ValueError("the ticket's run name is malformed")
    if not isinstance(run.file, str) or not _FILE.fullmatch(run.file):
        raise ValueError("the ticket's file name is malformed")
    if run.key != incoming_key(ticket.ir, ticket.upload_id, index, run.name):
        raise ValueError("the ticket's key is not its lease's")
    if not _whole(run.size, 1, MAX_BYTES - 1):
        raise ValueError("the ticket's size is out of range")


def _whole(value: object, low: int, high: int) -> bool:
    """An int (not a bool) within [low, high]."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _sign(key: bytes, payload: str) -> bytes:
    if not isinstance(key, bytes) or len(key) < 16:
        raise ValueError("the ticket key must be at least 16 bytes")
    return hmac.new(key, _LABEL + f"{VERSION}.{payload}".encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")
