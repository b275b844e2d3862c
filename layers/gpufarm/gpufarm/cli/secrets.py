"""`gpufarm secrets`: write the deployment's secret keys to Secrets Manager, one secret per key
(`<GPUFARM_SECRETS_NAME>/<key>`), and rotate the profile pages' link key (gpufarm.setup.secrets says what each
writes). Values are never printed: each line names a key, its secret and what was done."""

from __future__ import annotations

import secrets as random_keys
from typing import Any

import click

from gpufarm.cli import BadInput
from gpufarm.core.kernel.errors import Conflict, GpufarmError, ValidationFailed

DEFAULT_PREFIX = "gpufarm/secrets"
PREFIX_HELP = "Prefix of the secrets, as the stack's SecretsName [env GPUFARM_SECRETS_NAME; default gpufarm/secrets]."
# Bytes of randomness in a new link key (base64url: 64 characters).
NEW_KEY_BYTES = 48


@click.group()
def secrets() -> None:
    """The deployment's secret keys in Secrets Manager (one secret per key, so each function reads only its own)."""


def _store(prefix: str | None) -> Any:
    from gpufarm.adapters.secret_store import SecretStore
    from gpufarm.config import Settings

    settings = Settings()
    name = (prefix or settings.secrets_name or DEFAULT_PREFIX).strip()
    try:
        return SecretStore(settings, name)
    except ValidationFailed as exc:
        raise BadInput(exc.message) from None


def _write(store: Any, writes: list[tuple[str, str]]) -> None:
    for key, value in writes:
        try:
            done = store.put(key, value)
        except GpufarmError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"{key}: {done} ({store.name(key)})")


@secrets.command()
@click.option(
    "--from-file",
    "source",
    required=True,
    type=click.File("r", encoding="utf-8"),
    help="JSON object of gpufarm's secret keys and their values ('-' reads standard input).",
)
@click.option("--prefix", help=PREFIX_HELP)
def put(source: Any, prefix: str | None) -> None:
    """Create or update one secret per key of the document. The whole document is checked before anything is
    written; a key it does not name is left as it is. Setting profile_link_secret alone sets
    profile_link_secret_previous to it too (no rotation under way)."""
    from gpufarm.setup.secrets import MAX_DOCUMENT_BYTES, parse_document, put_writes

    text = source.read(MAX_DOCUMENT_BYTES + 1)
    try:
        writes = put_writes(parse_document(text))
    except ValidationFailed as exc:
        raise BadInput(exc.message) from None
    _write(_store(prefix), writes)


@secrets.command(name="rotate-link-key")
@click.option("--finish", is_flag=True, help="End the rotation: links signed with the previous key stop opening.")
@click.option("--prefix", help=PREFIX_HELP)
def rotate_link_key(finish: bool, prefix: str | None) -> None:
    """Rotate the key that signs the profile pages' links: the link key becomes the previous key (still accepted)
    and a new random key signs from now on. Run it again with --finish once the old links may stop opening."""
    from gpufarm.setup.secrets import LINK, PREVIOUS, finish_writes, rotation_writes

    store = _store(prefix)
    try:
        current, previous = store.value(LINK), store.value(PREVIOUS)
        if finish:
            writes = finish_writes(current, previous)
        else:
            writes = rotation_writes(current, previous, random_keys.token_urlsafe(NEW_KEY_BYTES))
    except (ValidationFailed, Conflict) as exc:
        raise BadInput(str(exc)) from None
    except GpufarmError as exc:
        raise click.ClickException(str(exc)) from None
    _write(store, writes)
    click.echo(_next_steps(finish, bool(writes)))


def _next_steps(finish: bool, wrote: bool) -> str:
    if finish and not wrote:
        return "No rotation was under way: only the link key opens links."
    if finish:
        return (
            "Rotation finished: only the link key opens links now. Links signed with the old key stop opening as "
            "each function reads its keys again (within 5 minutes)."
        )
    return (
        "Next: within 5 minutes each function reads the new key (links are signed with it from then on); the sync "
        "re-signs the dashboards' page links within its 15 minutes. Links signed before keep opening, with the "
        "previous key, until `gpufarm secrets rotate-link-key --finish` (after the longest link's life, "
        "GPUFARM_PROFILE_LINK_DAYS, for every old link to age out; sooner to cut a leaked key off)."
    )
