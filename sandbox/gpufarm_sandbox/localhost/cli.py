"""`gpufarm local`: the sandbox plus every function of template.yaml, until Ctrl-C.

Before the Function URLs accept requests it applies the Datadog setup (`gpufarm datadog apply`: incident type,
fields, secret variable, webhooks, notification rules, idle monitors) on its sandbox with the local functions' URLs
and secret, so the first `/gpu request` works; `--no-setup` starts bare, to try `gpufarm datadog apply` by hand.

Extensions (e.g. simulated GPU nodes) plug in as hooks: a hook receives the running LocalEnv and may return a
cleanup callable. A new option adds its hook in `local()`; `run_local` takes care of starting and stopping them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import click

from gpufarm.core.kernel.errors import GpufarmError
from gpufarm_sandbox.cli import datadog_quirks_option, wait_for_interrupt
from gpufarm_sandbox.emulator.quirks import describe_quirks
from gpufarm_sandbox.localhost.env import redacted
from gpufarm_sandbox.localhost.start import LocalEnv, start_local
from gpufarm_sandbox.localhost.template import TemplateError

Cleanup = Callable[[], None]
Hook = Callable[[LocalEnv], Cleanup | None]

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
    lines.append(f"dashboards: {env.url}/dashboards (gpufarm's dashboards drawn from the sandbox's metrics)")
    return lines


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
) -> None:
    """Start everything (with setup, the Datadog setup applied first; the sandbox playing the Datadog quirk modes
    `quirks`), run the hooks, print the summary, block until interrupted, then clean up in reverse."""
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
        click.echo(f"ready in {time.perf_counter() - started:.2f}s; Ctrl-C stops")
        (wait or wait_for_interrupt)(lambda: None)


def monitor_ticker_hook(env: LocalEnv) -> Cleanup:
    """Evaluate monitors as real time passes too, not only when the sandbox clock is advanced."""
    env.sandbox.monitors.start_ticker(5.0)
    return env.sandbox.monitors.stop_ticker


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", default=8320, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option(
    "--template",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="SAM template (default: ./template.yaml).",
)
@click.option("--show-secrets", is_flag=True, help="Print the sandbox credentials instead of ***.")
@click.option(
    "--nodes",
    type=click.IntRange(0, 64),
    default=0,
    show_default=True,
    help="Simulated GPU nodes running gpufarm-node on fake NVML (cloud, HPC and slicing pools).",
)
@click.option("--node-interval", type=click.FloatRange(1, 300), default=15.0, show_default=True, help="Seconds.")
@click.option(
    "--no-setup",
    is_flag=True,
    help="Start without the Datadog setup (incident type, fields, webhooks, rules, monitors), "
    "e.g. to run `gpufarm datadog apply` against the sandbox by hand.",
)
@datadog_quirks_option()
def local(
    *,
    host: str,
    port: int,
    template: Path | None,
    show_secrets: bool,
    nodes: int,
    node_interval: float,
    no_setup: bool,
    quirks: frozenset[str],
) -> None:
    """Run the sandbox and every function of template.yaml locally (Function URLs, invokes, queues, schedules),
    with the Datadog setup applied to the sandbox first."""
    hooks: list[Hook] = [monitor_ticker_hook]
    if nodes:
        from gpufarm_sandbox.simfarm import local_nodes_hook

        hooks.append(local_nodes_hook(nodes, interval=node_interval))
    try:
        run_local(
            host, port, template=template, hooks=hooks, show_secrets=show_secrets, setup=not no_setup, quirks=quirks
        )
    except (TemplateError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    except GpufarmError as exc:
        # The Datadog setup was blocked or refused; its message names what, never a secret.
        raise click.ClickException(f"datadog setup failed: {exc}") from None
    except OSError as exc:
        raise click.ClickException(f"cannot start on {host}:{port}: {exc.strerror or exc}") from None
