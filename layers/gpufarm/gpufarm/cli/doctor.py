"""`gpufarm doctor`: check a live Datadog org and Slack workspace for what gpufarm relies on, one line per check
(gpufarm.setup.doctor), with the settings `gpufarm datadog apply` reads."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from typing import Any

import click

from gpufarm.cli import BadInput
from gpufarm.config import ConfigurationError, Settings
from gpufarm.core.config.farm import FarmConfigError
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.setup.doctor.keys import unset_keys
from gpufarm.setup.doctor.ports import Collaborators, Options
from gpufarm.setup.doctor.report import CHECK_WIDTH, Line, Status, exit_status, row
from gpufarm.setup.doctor.run import run_checks
from gpufarm.setup.doctor.secrets import SECRET_KEYS_CHECK
from gpufarm.setup.plan import IDLE_WEBHOOK_URL_ENV, INCIDENT_WEBHOOK_URL_ENV

INGRESS_URL_ENV = "GPUFARM_SLACK_INGRESS_URL"
EXIT_INTERRUPTED = 130

EPILOG = """\b
Statuses:
  confirmed  Datadog or Slack behaves as gpufarm's main path expects
  fell back  it behaves another way; gpufarm detects it and works around it
  broken     gpufarm cannot work this way; the line says what to fix
  skipped    not checked; the line says what would check it
\b
Exit status:
  0  everything confirmed (skipped lines allowed)
  1  something is broken (a wrong key or site stops at once, before anything is written)
  2  bad input: a usage error or an invalid farm configuration
  3  something fell back, nothing is broken
"""


@click.command(epilog=EPILOG)
@click.option("--json", "as_json", is_flag=True, help="Print the lines as one JSON list of {check, status, detail}.")
@click.option(
    "--host",
    help="A host Datadog lists: a scratch tag gpufarm_doctor:<random> is written to it, read back and removed "
    "[without it that check is skipped].",
)
@click.option(
    "--webhook-wait",
    type=click.FloatRange(1, 600),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the probe incident's webhook (and for the scratch tag to show in the host list).",
)
@click.option(
    "--farm-config",
    type=click.Path(dir_okay=False),
    help="Farm YAML (as `gpufarm datadog apply` takes it): dropdown choices and the idle monitors to validate "
    "[default: GPUFARM_FARM_CONFIG or the SSM parameter GPUFARM_FARM_CONFIG_PARAMETER].",
)
@click.option("--site", help="Datadog site, e.g. datadoghq.eu or us5.datadoghq.com [default: DD_SITE].")
@click.option("--incident-type", help="Name of gpufarm's incident type [default: GPUFARM_INCIDENT_TYPE].")
@click.option(
    "--incident-webhook-url",
    envvar=INCIDENT_WEBHOOK_URL_ENV,
    help=f"The incident webhook's Function URL [env {INCIDENT_WEBHOOK_URL_ENV}; default: what Datadog calls].",
)
@click.option(
    "--idle-webhook-url",
    envvar=IDLE_WEBHOOK_URL_ENV,
    help=f"The idle alert's Function URL [env {IDLE_WEBHOOK_URL_ENV}; default: what Datadog calls].",
)
@click.option(
    "--ingress-url", envvar=INGRESS_URL_ENV, help=f"The Slack ingress's Function URL [env {INGRESS_URL_ENV}]."
)
@click.option(
    "--operators-channel",
    help="The operators' Slack channel id [default: GPUFARM_OPERATORS_CHANNEL or the farm's operators_channel].",
)
def doctor(**given: Any) -> None:
    """Check the live Datadog org and Slack workspace gpufarm runs on: keys and permissions, gpufarm's incident
    type and fields, the notification rule and webhook round trip, every search form, a tag on a host, the idle
    monitors, the Slack scopes and channel, and the Function URLs. Scratch objects (a probe incident, a tag) are
    removed when doctor ends, Ctrl-C included."""
    from gpufarm.adapters.aws import load_settings

    try:
        settings = _settings(load_settings(), given)
        options = _options(settings, given)
    except FarmConfigError as exc:
        raise BadInput(str(exc)) from None
    except GpufarmError as exc:
        raise click.ClickException(str(exc)) from None
    as_json = bool(given["as_json"])
    first: list[Line] = []
    if settings.secrets_name:
        first.append(_secret_keys_line(settings))
        if not as_json:
            click.echo(row(first[0], CHECK_WIDTH))
    unset = unset_keys(settings)
    if unset is not None:
        if not as_json:
            click.echo(row(unset, CHECK_WIDTH))
        _finish([*first, unset], as_json)
    _finish([*first, *_run(settings, options, as_json)], as_json)


def _secret_keys_line(settings: Settings) -> Line:
    """Which of the deployment's secrets `<GPUFARM_SECRETS_NAME>/<key>` exist (read with the settings: no call)."""
    from gpufarm.adapters.aws import read_secrets
    from gpufarm.setup.doctor.secrets import secret_keys_line

    assert settings.secrets_name is not None
    try:
        found = read_secrets(settings)
    except GpufarmError as exc:
        return Line(SECRET_KEYS_CHECK, Status.BROKEN, str(exc))
    return secret_keys_line(settings.secrets_name, found)


def _settings(settings: Settings, given: dict[str, Any]) -> Settings:
    updates: dict[str, Any] = {}
    if given["site"]:
        updates |= {"datadog_site": given["site"].strip(), "datadog_host": None}
    if given["farm_config"]:
        updates |= {"farm_config": given["farm_config"], "farm_config_parameter": None}
    if given["incident_type"]:
        updates["incident_type"] = given["incident_type"].strip()
    return settings.replace(**updates) if updates else settings


def _options(settings: Settings, given: dict[str, Any]) -> Options:
    from gpufarm.cli.datadog import load_farm

    farm = load_farm(settings, required=bool(given["farm_config"]))
    channel = given["operators_channel"] or settings.operators_channel or (farm.operators_channel if farm else None)
    return Options(
        datadog_url=settings.datadog_base_url(),
        incident_type=settings.incident_type,
        farm=farm,
        host=(given["host"] or "").strip() or None,
        wait_s=float(given["webhook_wait"]),
        ingress_url=given["ingress_url"] or None,
        incident_webhook_url=given["incident_webhook_url"] or None,
        idle_webhook_url=given["idle_webhook_url"] or None,
        profile_pages_url=settings.profile_pages_url,
        profile_upload_url=settings.api_url,
        operators_channel=channel,
    )


def _run(settings: Settings, options: Options, as_json: bool) -> list[Line]:
    from gpufarm.adapters.aws import function_url_answer
    from gpufarm.adapters.datadog import DatadogGateway
    from gpufarm.adapters.datadog_admin import DatadogAdmin

    admin = DatadogAdmin(settings)
    gateway = DatadogGateway(settings)
    slack, slack_missing = _slack(settings)
    collaborators = Collaborators(
        admin=admin,
        incidents=gateway,
        hosts=gateway,
        searches=gateway,
        slack=slack,
        url_answer=lambda url, body, kind: function_url_answer(
            url, body=body, content_type=kind, timeout=settings.http_timeout
        ),
        slack_missing=slack_missing,
    )

    def emit(line: Line) -> None:
        if not as_json:
            click.echo(row(line, CHECK_WIDTH))

    try:
        with _sigterm_interrupts():
            return run_checks(collaborators, options, emit)
    except KeyboardInterrupt:
        click.echo(
            "interrupted: doctor's scratch objects were removed (any it could not remove are named above)", err=True
        )
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
    finally:
        admin.close()
        gateway.close()


def _slack(settings: Settings) -> tuple[Any, str]:
    from gpufarm.adapters.slack import SlackChat

    try:
        return SlackChat.from_settings(settings), ""
    except ConfigurationError as exc:  # the secret <prefix>/slack_bot_token is not there
        return None, f"no Slack bot token: {exc}"
    except ValueError:
        return None, "no Slack bot token: set SLACK_BOT_TOKEN (or the secret key slack_bot_token)"


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops doctor as Ctrl-C does, so its scratch objects are removed either way."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: only Ctrl-C then
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _finish(lines: list[Line], as_json: bool) -> None:
    """Print the JSON list (or, after the rows printed as they came, a count per status) and exit with the status
    the lines make. A run stopped at the keys prints its one line and nothing more."""
    if as_json:
        click.echo(json.dumps([line.as_json() for line in lines], indent=2))
    elif len(lines) > 1:
        counts = {s: sum(1 for line in lines if line.status is s) for s in Status}
        click.echo(", ".join(f"{n} {s.value}" for s, n in counts.items() if n))
    click.get_current_context().exit(exit_status(lines))
