"""`gpufarm-node` arguments, the fake mode, and the exit status when there is no NVML."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest
from click.testing import CliRunner

from gpufarm_node.cli import EXIT_NO_NVML, EXIT_USAGE, main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "node"


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for name in ("DD_API_KEY", "DD_APP_KEY", "DD_API_KEY_FILE", "DD_APP_KEY_FILE", "GPUFARM_DATADOG_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    return CliRunner()


def test_fake_once_dry_run_prints_the_cycle_as_api_v2_json(runner: CliRunner) -> None:
    args = [
        "--fake",
        str(FIXTURES / "tiny.yaml"),
        "--once",
        "--dry-run",
        "--hostname",
        "node-7",
        "--environment",
        "onprem-hpc",
    ]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    util = [s for s in payload["series"] if s["metric"] == "gpufarm.gpu.utilization"]
    assert len(util) == 2 and util[0]["resources"] == [{"name": "node-7", "type": "host"}]
    assert {t for s in util for t in s["tags"] if t.startswith("gpu_ir:")} == {"gpu_ir:ir-70", "gpu_ir:none"}
    assert "environment:onprem-hpc" in util[0]["tags"]


def test_packaged_topologies_are_found_by_name(runner: CliRunner) -> None:
    result = runner.invoke(main, ["--fake", "a100-mig-slicing", "--once", "--dry-run", "--per-process"])
    assert result.exit_code == 0, result.output
    assert "gpufarm.process.memory.used" in result.stdout


def test_no_nvml_library_is_a_clear_message_and_exit_3(runner: CliRunner) -> None:
    result = runner.invoke(main, ["--fake", str(FIXTURES / "no-library.yaml"), "--once", "--dry-run"])
    assert result.exit_code == EXIT_NO_NVML
    assert "NVML unavailable" in result.stderr and "libnvidia-ml.so.1" in result.stderr


def test_the_real_nvml_path_without_a_driver_exits_3(runner: CliRunner) -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    result = runner.invoke(main, ["--once", "--dry-run"])
    assert result.exit_code == EXIT_NO_NVML and "NVML unavailable" in result.stderr


def test_without_an_api_key_the_agent_says_which_variable_to_set(runner: CliRunner) -> None:
    result = runner.invoke(main, ["--fake", str(FIXTURES / "tiny.yaml"), "--once"])
    assert result.exit_code == EXIT_USAGE and "DD_API_KEY" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "0"], "--interval"),
        (["--dogstatsd", "localhost"], "HOST:PORT"),
        (["--dogstatsd", "localhost:99999"], "HOST:PORT"),
        (["--environment", "9lives"], "starts with a letter"),
        (["--hostname", "bad host"], "not a host name"),
        (["--fake", "nope"], "no packaged topology"),
        (["--fake", "tiny", "--proc-root", "/tmp"], "drop --proc-root"),
        (["--dry-run", "--dogstatsd", "127.0.0.1:8125"], "exclude each other"),
        (["--idle-threshold", "101"], "--idle-threshold"),
    ],
)
def test_bad_arguments_exit_2_with_the_reason(runner: CliRunner, args: list[str], message: str) -> None:
    result = runner.invoke(main, [*args, "--once"])
    assert result.exit_code == EXIT_USAGE
    assert message in result.output


def test_help_lists_the_options(runner: CliRunner) -> None:
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    for option in ("--interval", "--once", "--fake", "--per-process", "--dogstatsd", "--dry-run", "--environment"):
        assert option in result.output


def test_the_agent_imports_nothing_heavy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, gpufarm_node.cli, gpufarm_node.agent, gpufarm_node.sender, gpufarm_node.registration, "
        "gpufarm_node.nvml.source, gpufarm_node.fakenode, gpufarm_node.podresources\n"
        "from gpufarm_node.datadog import DatadogTarget, api_client, tags_api\n"
        "from gpufarm_node.sender import SeriesIntake\n"
        "SeriesIntake(api_client(DatadogTarget('http://127.0.0.1:9', 'k')))\n"
        "banned = ('pydantic', 'slack_sdk', 'boto3', 'aws_lambda_powertools', 'datadog_api_client.v2.models')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in banned or m in banned))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"


def test_kubernetes_enforcement_needs_the_host_tags_and_an_in_cluster_config(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["--fake", str(FIXTURES / "tiny.yaml"), "--once", "--enforce", "kubernetes"]
    without_tags = runner.invoke(main, [*base, "--dry-run"])
    assert without_tags.exit_code == EXIT_USAGE and "DD_APP_KEY" in without_tags.output
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    env = {"DD_API_KEY": "k", "DD_APP_KEY": "a", "GPUFARM_DATADOG_HOST": "http://127.0.0.1:9"}
    outside = runner.invoke(main, [*base, "--no-register"], env=env)
    assert outside.exit_code == EXIT_USAGE and "no in-cluster configuration" in outside.output, outside.output
    bad_node = runner.invoke(main, [*base, "--dry-run", "--node-name", "Node_1"])
    assert bad_node.exit_code == EXIT_USAGE and "not a Kubernetes Node name" in bad_node.output


def test_kubernetes_enforcement_wires_pod_squatters_and_their_eviction(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--enforce kubernetes`: the step's thread marks the Node and evicts what the stopper hands it; the pods on
    devices of another lease are the agent's squatter source."""
    import types

    from gpufarm_node import cli
    from gpufarm_node.attribution import DeviceOwner
    from gpufarm_node.enforce import kube
    from gpufarm_node.enforce.kube_evict import PodEvictor
    from gpufarm_node.squatter_stops import ProcessStarts, SquatterStopper

    class Api:
        def get(self, name: str) -> dict[str, object]:
            return {"metadata": {"name": name, "labels": {}}, "spec": {"taints": []}}

        def patch(self, name: str, body: object) -> None:
            return None

        def evict(self, namespace: str, name: str) -> bool:
            return True

    monkeypatch.setattr(kube, "KubernetesNodeApi", Api)
    tags = types.SimpleNamespace(known=True, assignments={"mig-1": "ir-5"}, host_ir=None)
    owners = {"MIG-1": DeviceOwner("team-b", "intruder", "main", None, "ir-9")}
    agent = types.SimpleNamespace(
        host_tags=tags,
        squatter_source=None,
        squatter_stops=SquatterStopper(ProcessStarts("/nonexistent")),
        attributor=types.SimpleNamespace(device_owners=owners),
        lease_marks=None,
    )
    env = {"DD_API_KEY": "k", "GPUFARM_DATADOG_HOST": "http://127.0.0.1:9"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    marker = cli.kubernetes_step({"node_name": "gpu-1", "hostname": "gpu-1", "cluster": "k8s-shared"}, agent)
    try:
        assert agent.lease_marks is marker and isinstance(marker.evictions, PodEvictor)
        assert agent.squatter_stops.evict is marker.evictions
        [squatter] = agent.squatter_source()
        assert (squatter.device, squatter.device_ir, squatter.claimed_ir) == ("mig-1", "ir-5", "ir-9")
        assert squatter.pod is not None and (squatter.pod.namespace, squatter.pod.name) == ("team-b", "intruder")
        tags.known = False  # no good read of the host's tags: nothing is a squatter by it
        assert agent.squatter_source() == []
    finally:
        marker.close()
