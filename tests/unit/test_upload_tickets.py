"""Upload tickets (gpufarm.profiling.tickets): what `begin` promised comes back to `complete` as it was, or not."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest

from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.upload_token import mint as mint_token
from gpufarm.core.kernel.upload_token import verify as verify_token
from gpufarm.profiling import intake
from gpufarm.profiling.tickets import (
    MAX_TICKET_CHARS,
    InvalidTicket,
    Ticket,
    TicketRun,
    incoming_key,
    mint,
    verify,
)

KEY = b"ticket-test-key-0123456789abcdef"
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
UPLOAD_ID = "0123456789abcdef0123456789abcdef"


def _ticket(**changes: object) -> Ticket:
    runs = (
        TicketRun("run-1", incoming_key(12, UPLOAD_ID, 0, "run-1"), 1000, "t.json.gz"),
        TicketRun("run-2", incoming_key(12, UPLOAD_ID, 1, "run-2"), 2000, "u.json"),
    )
    values: dict[str, object] = {
        "ir": 12,
        "user": "U0000000001",
        "upload_id": UPLOAD_ID,
        "issued": NOW,
        "expires": NOW + timedelta(hours=2),
        "batch_size": 32,
        "runs": runs,
    }
    values.update(changes)
    return Ticket(**values)  # type: ignore[arg-type]


def _payload(text: str) -> dict[str, object]:
    part = text.split(".")[1]
    value: dict[str, object] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return value


def _resigned(body: dict[str, object]) -> str:
    """A ticket with an edited payload and the original signature: what a holder without the key can make."""
    original = mint(_ticket(), KEY)
    payload = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    return f"gft1.{payload}.{original.split('.')[2]}"


def test_a_ticket_comes_back_as_minted() -> None:
    ticket = _ticket()
    assert verify(mint(ticket, KEY), KEY, NOW + timedelta(minutes=5)) == ticket


def test_keys_are_under_the_leases_own_incoming_prefix() -> None:
    assert incoming_key(12, UPLOAD_ID, 1, "run-2") == f"incoming/ir-12/{UPLOAD_ID}/1-run-2"


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b.update(ir=13),
        lambda b: b.update(user="U0000000002"),
        lambda b: b.update(exp=b["exp"] + 86_400),  # type: ignore[operator]
        lambda b: b["runs"][0].__setitem__(2, 10**9),  # type: ignore[index]
    ],
    ids=["another lease", "another user", "a later expiry", "a larger size"],
)
def test_an_edited_ticket_is_refused(edit: object) -> None:
    body = _payload(mint(_ticket(), KEY))
    edit(body)  # type: ignore[operator]
    with pytest.raises(InvalidTicket, match="not gpufarm's"):
        verify(_resigned(body), KEY, NOW)


def test_a_ticket_under_another_key_or_an_upload_token_is_refused() -> None:
    with pytest.raises(InvalidTicket, match="not gpufarm's"):
        verify(mint(_ticket(), b"another-key-0123456789abcdefghij"), KEY, NOW)
    # Both are signed with upload_token_secret; neither passes for the other.
    token = mint_token(12, "U0000000001", NOW + timedelta(hours=1), KEY)
    with pytest.raises(InvalidTicket):
        verify(token, KEY, NOW)
    with pytest.raises(Exception, match=r"malformed|not gpufarm's"):
        verify_token(mint(_ticket(), KEY), KEY, NOW)


def test_expired_malformed_and_oversize_tickets_are_refused() -> None:
    text = mint(_ticket(), KEY)
    with pytest.raises(InvalidTicket, match="expired"):
        verify(text, KEY, NOW + timedelta(hours=2))
    for bad in ("", "gft1", "gft1.a.b", "gft2" + text[4:], text + "A", "gft1." + "A" * MAX_TICKET_CHARS + ".x"):
        with pytest.raises(InvalidTicket, match=r"malformed|not gpufarm's"):
            verify(bad, KEY, NOW)


def test_minting_refuses_what_begin_could_never_write() -> None:
    other_lease = (TicketRun("run-1", incoming_key(13, UPLOAD_ID, 0, "run-1"), 1, "t.json"),)
    for bad in (
        _ticket(runs=other_lease),
        _ticket(runs=()),
        _ticket(ir=0),
        _ticket(batch_size=0),
        _ticket(upload_id="../x"),
        _ticket(runs=(TicketRun("run-1", incoming_key(12, UPLOAD_ID, 0, "run-1"), 1, "../etc/passwd"),)),
    ):
        with pytest.raises(ValueError):
            mint(bad, KEY)


def test_begin_bodies_are_bounded() -> None:
    ir, runs, batch = intake.parse_begin({"ir": 12, "runs": [{"name": "run-1", "bytes": 10, "file": "t.json"}]})
    assert (ir, [r.name for r in runs], batch) == (12, ["run-1"], None)
    with pytest.raises(intake.TooLarge):
        intake.parse_begin({"ir": 12, "runs": [{"name": "run-1", "bytes": 2 * 10**9}]})
    for body in (
        {"ir": "12", "runs": [{"name": "a", "bytes": 1}]},
        {"ir": 12, "runs": [{"name": "a", "bytes": True}]},
        {"ir": 12, "runs": [{"name": "a", "bytes": 1, "file": "a b"}]},
        {"ir": 12, "runs": [{"name": "a", "bytes": 1}], "batch_size": 0},
        {"ir": 12, "runs": "a"},
    ):
        with pytest.raises(ValidationFailed):
            intake.parse_begin(body)
