"""``tokens create|list|revoke``: the HTTP ingest API's bearer tokens. ``create`` prints the
token once (only its hash is kept); every change is in the audit log."""

from __future__ import annotations

import json

import click

from ...models import utcnow
from ...outbox.tokens import (
    DEFAULT_RATE,
    SCOPES,
    TokenError,
    create_token,
    list_tokens,
    revoke_token,
)
from .common import actor, services


@click.group("tokens")
def tokens() -> None:
    """Bearer tokens for POST /api/v1/usage."""


@tokens.command("create")
@click.argument("name")
@click.option("--scope", "scopes", multiple=True, type=click.Choice(SCOPES), default=SCOPES,
              show_default=True, help="What the token may do (repeatable).")
@click.option("--rate", type=float, default=DEFAULT_RATE, show_default=True,
              help="Requests a second the token may make (per serving process).")
def tokens_create(name: str, scopes: tuple[str, ...], rate: float) -> None:
    """Make a token and print it, this once."""
    try:
        token, secret = create_token(services().engine, name, scopes=tuple(scopes),
                                     rate_per_second=rate, actor=actor(), now=utcnow())
    except TokenError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(secret)
    click.echo(f"token {token.name!r} ({', '.join(token.scopes)}, {token.rate_per_second:g} "
               "requests/s): shown this once; keep it in the producer's secret store.",
               err=True)


@tokens.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def tokens_list(as_json: bool) -> None:
    """Every token: name, scopes, when made and last used, whether revoked (never the token)."""
    found = list_tokens(services().engine)
    if as_json:
        click.echo(json.dumps({"tokens": [
            {"name": t.name, "prefix": t.prefix, "scopes": list(t.scopes),
             "rate_per_second": t.rate_per_second, "created_at": t.created_at.isoformat(),
             "created_by": t.created_by,
             "last_used_at": t.last_used_at.isoformat() if t.last_used_at else None,
             "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
             "revoked_by": t.revoked_by} for t in found]}))
        return
    if not found:
        click.echo("no tokens yet: billing-outbox tokens create NAME")
    for t in found:
        used = t.last_used_at.strftime("%Y-%m-%d %H:%M") if t.last_used_at else "never"
        state = (f"revoked {t.revoked_at:%Y-%m-%d %H:%M} by {t.revoked_by}" if t.revoked_at
                 else "active")
        click.echo(f"{t.name}\t{t.prefix}…\t{','.join(t.scopes)}\tcreated "
                   f"{t.created_at:%Y-%m-%d %H:%M} by {t.created_by}\tlast used {used}\t{state}")


@tokens.command("revoke")
@click.argument("name")
def tokens_revoke(name: str) -> None:
    """Revoke a token at once: its next request is refused (403)."""
    try:
        token = revoke_token(services().engine, name, actor=actor(), now=utcnow())
    except TokenError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"revoked {token.name!r}")


COMMANDS: list[click.Command] = [tokens]
