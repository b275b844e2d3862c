"""`gpufarm-node`: the node agent's command line.

Exit status: 0 done, 2 bad arguments or Datadog settings, 3 NVML unavailable (no driver, no library).
"""

from __future__ import annotations

import logging
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from gpufarm_node import __version__

log = logging.getLogger("gpufarm_node")

EXIT_USAGE = 2
EXIT_NO_NVML = 3
_HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_TAG_VALUE = re.compile(r"^[A-Za-z][A-Za-z0-9_.:/-]{0,99}$")


@dataclass(frozen=True)
class _Endpoint:
    host: str
    port: int


def _hostport(ctx: click.Context, param: click.Parameter, value: str | None) -> _Endpoint | None:
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter("use HOST:PORT, e.g. 127.0.0.1:8125")
    return _Endpoint(host, int(port))


def _tag_value(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not _TAG_VALUE.match(value):
        raise click.BadParameter("starts with a letter; letters, digits and _ . : / - only (it becomes a tag)")
    return value


def _hostname(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    name = value or socket.gethostname()
    if not _HOSTNAME.match(name):
        raise click.BadParameter(f"{name[:60]!r} is not a host name")
    return name


def _node_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A Node name (a DNS subdomain), or None for the host name."""
    if value is not None and not _NODE_NAME.match(value):
        raise click.BadParameter(f"{value[:60]!r} is not a Kubernetes Node name")
    return value


@click.group(
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
@click.version_option(__version__, prog_name="gpufarm-node")
@click.option(
    "--interval",
    type=click.FloatRange(1, 3600),
    default=15.0,
    show_default=True,
    envvar="GPUFARM_NODE_INTERVAL",
    help="Seconds between collections.",
)
@click.option(
    "--flush-interval",
    type=click.FloatRange(0, 600),
    default=60.0,
    show_default=True,
    envvar="GPUFARM_NODE_FLUSH_INTERVAL",
    help="Seconds between pushes to Datadog (0: every cycle).",
)
@click.option("--once", is_flag=True, help="Collect and send one cycle, then exit.")
@click.option(
    "--fake",
    "fake",
    metavar="TOPOLOGY",
    help="Run on the fake NVML: a topology YAML file or a packaged name (e.g. h100x8-mig).",
)
@click.option(
    "--environment",
    default="default",
    show_default=True,
    envvar="GPUFARM_ENVIRONMENT",
    callback=_tag_value,
    help="Environment tag of this node (e.g. aws-cloud, onprem-hpc).",
)
@click.option(
    "--cluster",
    default="default",
    show_default=True,
    envvar="GPUFARM_CLUSTER",
    callback=_tag_value,
    help="Cluster tag of this node.",
)
@click.option(
    "--hostname",
    envvar=["GPUFARM_HOSTNAME", "DD_HOSTNAME"],
    callback=_hostname,
    help="Host name to report as (default: this machine's; match the Datadog Agent's).",
)
@click.option(
    "--per-process",
    is_flag=True,
    envvar="GPUFARM_NODE_PER_PROCESS",
    help="Also emit per-process series tagged with pid (more cardinality).",
)
@click.option(
    "--dogstatsd",
    metavar="HOST:PORT",
    callback=_hostport,
    help="Send to a local Datadog Agent's DogStatsD instead of the API.",
)
@click.option("--dry-run", is_flag=True, help="Print each cycle's series as JSON lines; send nothing.")
@click.option(
    "--proc-root",
    type=click.Path(file_okay=False),
    envvar="GPUFARM_PROC_ROOT",
    default="/proc",
    show_default=True,
    help="Where /proc is (the host's /proc mounted into a container).",
)
@click.option(
    "--pod-metadata",
    type=click.Path(dir_okay=False),
    envvar="GPUFARM_POD_METADATA",
    help="Kubelet /pods-shaped JSON file with pod labels (gpufarm.io/ir).",
)
@click.option(
    "--pod-resources-socket",
    envvar="GPUFARM_POD_RESOURCES_SOCKET",
    default="/var/lib/kubelet/pod-resources/kubelet.sock",
    show_default=True,
    help="kubelet pod-resources socket (used when present and grpcio is installed).",
)
@click.option(
    "--idle-threshold",
    type=click.FloatRange(0, 100),
    default=5.0,
    show_default=True,
    help="Activity (%) under which a device holding memory counts as idle-held.",
)
@click.option(
    "--held-memory-mib",
    type=click.IntRange(0, 1 << 20),
    default=64,
    show_default=True,
    help="Process memory (MiB) under which a device counts as idle, not idle-held.",
)
@click.option(
    "--register-interval",
    type=click.FloatRange(30, 86400),
    default=300.0,
    show_default=True,
    help="Seconds between host tag registrations.",
)
@click.option("--no-register", is_flag=True, help="Do not set inventory host tags.")
@click.option(
    "--no-tag-reads",
    is_flag=True,
    help="Do not read this host's tags every cycle (device assignments then come from processes and pods only).",
)
@click.option(
    "--enforce",
    type=click.Choice(["none", "kubernetes"]),
    default="none",
    show_default=True,
    envvar="GPUFARM_ENFORCE",
    help="kubernetes: label and taint this host's own Node while a dedicated lease holds it (the pool's "
    "`enforce: kubernetes`; in-cluster credentials, the `k8s` extra).",
)
@click.option(
    "--node-name",
    callback=_node_name,
    envvar="GPUFARM_NODE_NAME",
    help="This host's Kubernetes Node (default: the host name).",
)
@click.option("--pcie", is_flag=True, help="Read PCIe throughput (each read blocks ~20 ms in the driver).")
@click.option(
    "--buffer-points",
    type=click.IntRange(1000, 10_000_000),
    default=100_000,
    show_default=True,
    help="Points kept through a Datadog outage; the oldest are dropped beyond this.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    envvar="GPUFARM_NODE_LOG_LEVEL",
)
@click.pass_context
def main(ctx: click.Context, /, **opts: Any) -> None:
    """gpufarm-node: NVML metrics per GPU, MIG slice, process and container, attributed to IRs, sent to Datadog.

    Without a command it runs the agent; `gpufarm-node enforce slurm` runs the Slurm enforcer instead.
    """
    if ctx.invoked_subcommand is not None:
        return
    logging.basicConfig(
        level=getattr(logging, opts["log_level"].upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if opts["dry_run"] and opts["dogstatsd"]:
        raise click.UsageError("--dry-run and --dogstatsd exclude each other")
    if opts["fake"] and opts["proc_root"] != "/proc":
        raise click.UsageError("--fake generates its own /proc; drop --proc-root")
    from gpufarm_node.datadog import DatadogConfigError

    try:
        with _agent(opts) as agent:
            if opts["once"]:
                agent.cycle()
                return
            from gpufarm_node.agent import settle_process

            settle_process()
            stop = threading.Event()
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: stop.set())
            log.info("collecting every %.0fs on %s", opts["interval"], agent.hostname)
            agent.run(stop, opts["interval"])
    except DatadogConfigError as exc:
        click.echo(f"gpufarm-node: {exc}", err=True)
        sys.exit(EXIT_USAGE)


@contextmanager
def _agent(opts: dict[str, Any]) -> Iterator[Any]:
    """Build the agent from options; yields it started, closes it after."""
    try:
        import gpufarm_node.nvml.source  # noqa: F401  (pynvml: fails here, before anything starts, when it is missing)
        from gpufarm_node.nvml.errors import NvmlUnavailable
    except ImportError as exc:
        click.echo(f"gpufarm-node: nvidia-ml-py is missing ({exc}); pip install gpufarm-node", err=True)
        sys.exit(EXIT_NO_NVML)

    workdir: Path | None = None
    topology = _fake_topology(opts) if opts["fake"] else None
    try:
        sender, registrar, host_tags = _outputs(opts)
        if topology is not None:
            workdir = Path(tempfile.mkdtemp(prefix="gpufarm-node-fake-"))
            agent = _fake_agent(opts, topology, workdir, sender, registrar=registrar, host_tags=host_tags)
        else:
            agent = _nvml_agent(opts, sender, registrar, host_tags)
        try:
            agent.start()
        except NvmlUnavailable as exc:
            click.echo(f"gpufarm-node: NVML unavailable: {exc}", err=True)
            sys.exit(EXIT_NO_NVML)
        marker = None
        try:
            if opts["enforce"] == "kubernetes":
                marker = kubernetes_step(opts, agent)
            yield agent
        finally:
            if marker is not None:
                marker.close()
            agent.close()
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _agent_options(opts: dict[str, Any]) -> dict[str, Any]:
    """Agent keyword arguments shared by the NVML and the fake wiring."""
    from gpufarm_node.collect import CollectOptions

    return {
        "hostname": opts["hostname"],
        "environment": opts["environment"],
        "cluster": opts["cluster"],
        "options": CollectOptions(opts["idle_threshold"], opts["held_memory_mib"] << 20, opts["per_process"]),
        "flush_interval": 0.0 if opts["once"] else opts["flush_interval"],
    }


def _xid_mode(opts: dict[str, Any]) -> Any:
    """A background XID thread for a running agent; one poll is enough for --once."""
    return "poll" if opts["once"] else "thread"


def _nvml_agent(opts: dict[str, Any], sender: Any, registrar: Any, host_tags: Any) -> Any:
    from gpufarm_node.agent import Agent
    from gpufarm_node.attribution import Attributor, PodMetadataFile, PodResourcesOwners, ProcFs
    from gpufarm_node.nvml.source import NvmlSource
    from gpufarm_node.podresources import kubelet_lister
    from gpufarm_node.squatter_stops import ProcessStarts, SquatterStopper

    pods = PodMetadataFile(opts["pod_metadata"]) if opts["pod_metadata"] else None
    lister = kubelet_lister(opts["pod_resources_socket"])
    owners = PodResourcesOwners(lister, pods) if lister else None
    return Agent(
        NvmlSource(interval=opts["interval"], pcie=opts["pcie"], xid_mode=_xid_mode(opts)),
        Attributor(ProcFs(opts["proc_root"]), pods=pods, owners=owners),
        sender,
        registrar=registrar,
        host_tags=host_tags,
        # The stops gpufarm publishes on the host's tags (stop-after pools); nothing without tags to read.
        squatter_stops=SquatterStopper(ProcessStarts(opts["proc_root"])) if host_tags is not None else None,
        **_agent_options(opts),
    )


def _fake_topology(opts: dict[str, Any]) -> Any:
    from gpufarm_node.topology import load_topology, packaged_topology
    from gpufarm_node.topology_spec import TopologyError

    name = opts["fake"]
    try:
        path = Path(name) if Path(name).is_file() else packaged_topology(name)
        return load_topology(path, seed=opts["hostname"])
    except TopologyError as exc:
        raise click.BadParameter(str(exc), param_hint="--fake") from exc


def _fake_agent(
    opts: dict[str, Any], topology: Any, workdir: Path, sender: Any, *, registrar: Any, host_tags: Any
) -> Any:
    from gpufarm_node.fakenode import fake_node

    node = fake_node(
        topology,
        workdir,
        sender,
        registrar=registrar,
        host_tags=host_tags,
        xid_mode=_xid_mode(opts),
        pcie=opts["pcie"],
        interval=opts["interval"],
        **_agent_options(opts),
    )
    return node.agent


def _outputs(opts: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The sender and (when keys allow) the registrar and the per-cycle host tags read."""
    from gpufarm_node.datadog import api_client, tags_api, target_from_env
    from gpufarm_node.hosttags import HostTagWatch
    from gpufarm_node.registration import HostRegistrar
    from gpufarm_node.sender import DatadogSender, DogStatsdSender, JsonLinesSender
    from gpufarm_node.series_post import DirectSeriesIntake

    interval = round(opts["interval"])
    if opts["dry_run"]:
        return JsonLinesSender(opts["hostname"], interval=interval), None, None
    endpoint = opts["dogstatsd"]
    target = target_from_env(need_api_key=endpoint is None)
    client = api_client(target) if target.api_key else None
    if endpoint is not None:
        sender: Any = DogStatsdSender(endpoint.host, endpoint.port)
    else:
        sender = DatadogSender(
            DirectSeriesIntake.from_client(client),
            opts["hostname"],
            interval=interval,
            max_points=opts["buffer_points"],
        )
    registrar = None
    if opts["no_register"]:
        log.info("host registration is off (--no-register)")
    elif client is None or not target.app_key:
        log.warning("no DD_APP_KEY: this node will not register its inventory host tags")
    else:
        registrar = HostRegistrar(
            tags_api(client),
            opts["hostname"],
            opts["environment"],
            opts["cluster"],
            interval=opts["register_interval"],
        )
    host_tags = None
    if client is not None and target.app_key and not opts["no_tag_reads"]:
        host_tags = HostTagWatch.from_client(client, opts["hostname"])
    return sender, registrar, host_tags


def kubernetes_step(opts: dict[str, Any], agent: Any) -> Any:
    """The Kubernetes step (gpufarm_node.enforce.kube), started in its own thread and handed to the agent: the Node's
    marks, the pods on devices of another lease reported as squatters, and their eviction where gpufarm stops them."""
    if agent.host_tags is None:
        raise click.UsageError("--enforce kubernetes reads the host's lease from its tags: it needs DD_APP_KEY")
    try:
        from gpufarm_node.enforce.kube import KubernetesNodeApi, NodeMarker
        from gpufarm_node.enforce.kube_evict import PodEvictor
    except ImportError as exc:  # pragma: no cover - the modules themselves import nothing optional
        raise click.UsageError(f"--enforce kubernetes: {exc}") from None
    from gpufarm_node.datadog import target_from_env
    from gpufarm_node.enforce.datadog_io import DatadogIO

    try:
        api = KubernetesNodeApi()
    except ImportError:
        raise click.UsageError(
            "--enforce kubernetes needs the kubernetes client: pip install 'gpufarm-node[k8s]'"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the client's ConfigException: not in a pod with a service account
        raise click.UsageError(f"--enforce kubernetes: no in-cluster configuration ({str(exc)[:200]})") from None
    node = opts["node_name"] or opts["hostname"]
    reporter = DatadogIO(target_from_env())
    evictor = PodEvictor(api, node, reporter, cluster_tag=opts["cluster"])
    marker = NodeMarker(api, node, reporter, cluster_tag=opts["cluster"], evictions=evictor)
    marker.start()
    agent.lease_marks = marker
    if agent.squatter_source is None:
        from gpufarm_node.squatters import pod_squatters

        attributor = agent.attributor
        agent.squatter_source = pod_squatters(lambda: attributor.device_owners, agent.host_tags)
    if agent.squatter_stops is not None:
        agent.squatter_stops.evict = evictor
    log.info("Kubernetes enforcement on: Node %s is labelled and tainted while a dedicated lease holds it", node)
    return marker


def _commands() -> None:
    from gpufarm_node.enforce.cli import enforce

    main.add_command(enforce)


_commands()

if __name__ == "__main__":
    main()
