"""`gpufarm local`: the sandbox plus every function of template.yaml, a small farm on it, until Ctrl-C.

Before the Function URLs accept requests it applies the Datadog setup (`gpufarm datadog apply`: incident type,
fields, secret variable, webhooks, notification rules, idle monitors) on its sandbox with the local functions' URLs
and secret, so the first `/gpu request` works; `--no-setup` starts bare, to try `gpufarm datadog apply` by hand.
Then it seeds the example workspace (gpufarm_sandbox.example_farm: alice, bob and carol, researchers; dana, the
operator), starts the example farm's hosts as simulated nodes running the real agent on fake NVML (every pool;
`--no-farm` leaves them out), lets each send one cycle and runs the quota sync once, so the inventory, ledger and
dashboards have data from the start. Once ready it writes the state file (gpufarm.cli.local_state) through which
`gpufarm report`, `gpufarm profile upload` and the rest find it from another shell; `gpufarm local env` prints its
variables for other tools.

Extensions (e.g. simulated GPU nodes) plug in as hooks: a hook receives the running LocalEnv and may return a
cleanup callable. A new option adds its hook in `local()`; `run_local` takes care of starting and stopping them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import click

from gpufarm.cli import BadInput, local_state
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm_sandbox.cli import datadog_quirks_option, wait_for_interrupt
from gpufarm_sandbox.emulator.quirks import describe_quirks
from gpufarm_sandbox.localhost.env import redacted
from gpufarm_sandbox.localhost.start import LocalEnv, start_local
from gpufarm_sandbox.localhost.template import TemplateError

Cleanup = Callable[[], None]
Hook = Callable[[LocalEnv], Cleanup | None]

DEFAULT_PORT = 8320
SYNC_FUNCTION = "QuotaSyncFunction"
NO_SETUP = (
    "datadog setup: skipped (--no-setup); the sandbox has no gpufarm incident type, fields, webhooks, rules or "
    "monitors until `gpufarm datadog apply` runs against it"
)


def describe(env: LocalEnv, *, show_secrets: bool = False) -> list[str]:
    """What `gpufarm local` prints: function URLs, queues, schedules, the Datadog quirks played and the environment
    to export."""
    state = env.host.state()
    lines = [f"gpufarm local on {env.url}", f"datadog quirks: {describe_quirks(env.sandbox.quirks)}", "functions:"]
    for fn in state["functions"]:
        where = fn["url"] or "(no URL)"
        missing = "" if fn["present"] else "  [handler file missing]"
        lines.append(f"  {fn['name']:<26} {where}  {', '.join(fn['triggers'])}{missing}")
    for qid, queue in state["queues"].items():
        lines.append(f"queue {qid}: {queue['url']} -> {queue['consumer'] or 'no consumer'}")
    lines.extend(
        f"schedule {s['function']}.{s['name']}: {s['expression']} next {s['next_tick'] or '-'}"
        for s in state["schedules"]
    )
    lines.append("environment:")
    shown = env.env if show_secrets else redacted(env.env)
    lines.extend(f"  export {name}={value}" for name, value in sorted(shown.items()))
    lines.append("inspect: GET /_local/state, /_sandbox/state, /_sandbox/slack/messages")
    return lines


def open_lines(env: LocalEnv) -> list[str]:
    """One line per thing to open in a browser."""
    pages = [
        ("slack", "/slack", "the Slack workspace: be alice, bob, carol or dana and type /gpu"),
        ("dashboards", "/dashboards", "gpufarm's dashboards drawn from the sandbox's metrics"),
        ("incidents", "/incidents", "every lease: its fields and timeline"),
    ]
    return [f"open {name:<11} {env.url}{path}  ({what})" for name, path, what in pages if env.sandbox.serves(path)]


def run_local(
    host: str,
    port: int,
    *,
    template: Path | None = None,
    hooks: Sequence[Hook] = (),
    show_secrets: bool = False,
    wait: Callable[[Cleanup], None] | None = None,
    setup: bool = True,
    quirks: str | Iterable[str] = (),
    state: Path | None = None,
) -> None:
    """Start everything (with setup, the Datadog setup applied first; the sandbox playing the Datadog quirk modes
    `quirks`), run the hooks, print the summary, write the state file `state` (if given), block until interrupted,
    then clean up in reverse."""
    started = time.perf_counter()
    local_env = start_local(host, port, template=template, setup=setup, profiles=True, quirks=quirks)
    with local_env as env, contextlib.ExitStack() as stack:
        for hook in hooks:
            cleanup = hook(env)
            if cleanup is not None:
                stack.callback(cleanup)
        for line in describe(env, show_secrets=show_secrets):
            click.echo(line)
        for line in env.setup.lines() if env.setup is not None else [NO_SETUP]:
            click.echo(line)
        if state is not None:
            for line in publish_state(state, env):
                click.echo(line)
            stack.callback(local_state.remove_state, state)
        for line in open_lines(env):
            click.echo(line)
        click.echo(f"ready in {time.perf_counter() - started:.2f}s; Ctrl-C stops")
        (wait or wait_for_interrupt)(lambda: None)


def publish_state(path: Path, env: LocalEnv) -> list[str]:
    """Write the state file other shells find this host by, unless another running local host owns it."""
    said: list[str] = []
    other = local_state.find_running(path, said.append)
    if other is not None and other.pid != os.getpid():
        return [
            f"note: the gpufarm local at {other.url} (pid {other.pid}) owns {path}: commands in other shells find "
            f"that one, not this one (GPUFARM_LOCAL_STATE=<another file> for both commands and this host picks it)"
        ]
    local_state.write_state(path, env.url, env.env)
    return [
        *said,
        f"other shells: `gpufarm report`, `gpufarm profile upload` and the rest use this host and its clock "
        f"(found through {path}); `gpufarm local env` prints its variables",
    ]


def seed_people_hook(env: LocalEnv) -> None:
    """The example workspace's people, channels and operators' group (the demo's, with the same ids)."""
    from gpufarm_sandbox.example_farm import seed_workspace

    seed_workspace(env.url)


def example_farm_hook(interval: float) -> Hook:
    """The example farm's hosts as simulated nodes on the local sandbox: one cycle each now (they register and
    send their first metrics), then every `interval` seconds in the background."""

    def hook(env: LocalEnv) -> Cleanup:
        from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY
        from gpufarm_sandbox.example_farm import host_specs
        from gpufarm_sandbox.simfarm import simulate_hosts

        # A job outside gpufarm runs on the L4 host: the ledger's unattributed usage shows it.
        farm = simulate_hosts(
            host_specs({"k8s-l4-01": "unattributed"}),
            env.url,
            DEFAULT_DD_API_KEY,
            DEFAULT_DD_APP_KEY,
            interval=interval,
            clock=env.sandbox.clock.now,
            background=False,
        )
        try:
            farm.step_all()
            farm.start()
        except BaseException:
            farm.stop()
            raise
        return farm.stop

    return hook


def first_sync_hook(env: LocalEnv) -> None:
    """The quota sync once now (inventory, ledger, gauges), instead of at its first quarter hour."""
    env.host.invoke(SYNC_FUNCTION, {"job": "quota_sync"})


def monitor_ticker_hook(env: LocalEnv) -> Cleanup:
    """Evaluate monitors as real time passes too, not only when the sandbox clock is advanced."""
    env.sandbox.monitors.start_ticker(5.0)
    return env.sandbox.monitors.stop_ticker


def local_hooks(*, setup: bool = True, farm: bool = True, nodes: int = 0, node_interval: float = 15.0) -> list[Hook]:
    """What `gpufarm local` runs once the host is up, in order: the monitor ticker; with setup, the people, the
    example farm's nodes (farm), `nodes` more nodes, and the first sync."""
    hooks: list[Hook] = [monitor_ticker_hook]
    if setup:
        hooks.append(seed_people_hook)
        if farm:
            hooks.append(example_farm_hook(node_interval))
    if nodes:
        from gpufarm_sandbox.simfarm import local_nodes_hook

        hooks.append(local_nodes_hook(nodes, interval=node_interval))
    if setup:
        hooks.append(first_sync_hook)
    return hooks


@click.group(invoke_without_command=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option(
    "--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port."
)
@click.option(
    "--template",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="SAM template (default: ./template.yaml).",
)
@click.option("--show-secrets", is_flag=True, help="Print the sandbox credentials instead of ***.")
@click.option(
    "--farm/--no-farm",
    default=True,
    show_default=True,
    help="The example farm's hosts (every pool) as simulated nodes running gpufarm-node on fake NVML.",
)
@click.option(
    "--nodes",
    type=click.IntRange(0, 64),
    default=0,
    show_default=True,
    help="More simulated GPU nodes, spread over the cloud, HPC and slicing pools.",
)
@click.option("--node-interval", type=click.FloatRange(1, 300), default=15.0, show_default=True, help="Seconds.")
@click.option(
    "--no-setup",
    is_flag=True,
    help="Start without the Datadog setup (incident type, fields, webhooks, rules, monitors), the people, the farm "
    "or the first sync, e.g. to run `gpufarm datadog apply` against the sandbox by hand.",
)
@datadog_quirks_option()
@click.pass_context
def local(
    ctx: click.Context,
    *,
    host: str,
    port: int,
    template: Path | None,
    show_secrets: bool,
    farm: bool,
    nodes: int,
    node_interval: float,
    no_setup: bool,
    quirks: frozenset[str],
) -> None:
    """Run the sandbox and every function of template.yaml locally (Function URLs, invokes, queues, schedules),
    with the Datadog setup applied, the example workspace seeded and the example farm's nodes running."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        run_local(
            host,
            port,
            template=template,
            hooks=local_hooks(setup=not no_setup, farm=farm, nodes=nodes, node_interval=node_interval),
            show_secrets=show_secrets,
            setup=not no_setup,
            quirks=quirks,
            state=local_state.state_path(),
        )
    except (TemplateError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    except GpufarmError as exc:
        # The Datadog setup was blocked or refused; its message names what, never a secret.
        raise click.ClickException(f"datadog setup failed: {exc}") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise BadInput(
                f"port {port} on {host} is in use (another gpufarm local?): pick another with --port, "
                f"e.g. `gpufarm local --port {port + 1 if 0 < port < 65535 else 8321}`"
            ) from None
        raise click.ClickException(f"cannot start on {host}:{port}: {exc.strerror or exc}") from None


@local.command("env")
def env_command() -> None:
    """Print the running local host's variables as `export NAME=value` lines (its sandbox's development
    credentials included), for tools other than gpufarm: `eval "$(gpufarm local env)"`."""
    path = local_state.state_path()
    notes: list[str] = []
    state = local_state.find_running(path, notes.append)
    for note in notes:
        click.echo(note, err=True)
    if state is None:
        click.echo(
            f"error: no gpufarm local is running (no live state file at {path}); start one with `make local`", err=True
        )
        sys.exit(1)
    for name, value in sorted(state.env.items()):
        click.echo(f"export {name}={shlex.quote(value)}")
