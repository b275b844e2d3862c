"""The systemd unit and the DaemonSet: they parse, and they give the agent what it needs (and no more)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import click
import yaml

from gpufarm_node.cli import main

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "gpufarm-node.service"
DAEMONSET = ROOT / "deploy" / "kubernetes" / "gpufarm-node-daemonset.yaml"


def _unit() -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    current = None
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert current is not None and sep, f"malformed unit line: {raw!r}"
        sections[current][key].append(value)
    return sections


def _cli_envvars() -> set[str]:
    names: set[str] = set()
    for param in main.params:
        if isinstance(param, click.Option) and param.envvar:
            names |= {param.envvar} if isinstance(param.envvar, str) else set(param.envvar)
    return names | {
        "DD_API_KEY_FILE",
        "DD_APP_KEY_FILE",
        "DD_SITE",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
    }


def test_systemd_unit_restarts_runs_the_agent_and_is_hardened() -> None:
    unit = _unit()
    service = unit["Service"]
    assert service["ExecStart"][0].split()[0].endswith("/gpufarm-node")
    assert service["Restart"] == ["always"] and service["RestartPreventExitStatus"] == ["2"]
    assert service["EnvironmentFile"] == ["/etc/gpufarm/node.env"]
    assert {c.split(":")[0] for c in service["LoadCredential"]} == {"dd_api_key", "dd_app_key"}
    assert "DD_API_KEY_FILE=%d/dd_api_key" in service["Environment"]
    for key in ("NoNewPrivileges", "ProtectKernelTunables", "RestrictSUIDSGID", "DynamicUser", "PrivateTmp"):
        assert service[key] == ["yes"], key
    assert service["ProtectSystem"] == ["strict"]
    assert set(service["CapabilityBoundingSet"][0].split()) == {"CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"}
    assert service["MemoryMax"] and service["CPUQuota"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    assert "DD_API_KEY=" not in UNIT.read_text().replace("$DD_API_KEY", "")


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]


def test_daemonset_has_host_pid_read_only_proc_pod_resources_and_the_gpu_runtime() -> None:
    (ds,) = [d for d in _docs() if d["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    env = {e["name"]: e for e in agent["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["GPUFARM_HOSTNAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["host-proc"]["hostPath"]["path"] == "/proc" and mounts["host-proc"]["readOnly"] is True
    assert mounts["host-proc"]["mountPath"] == env["GPUFARM_PROC_ROOT"]["value"]
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert mounts["pod-resources"]["readOnly"] is True
    assert env["GPUFARM_POD_RESOURCES_SOCKET"]["value"].startswith(mounts["pod-resources"]["mountPath"] + "/")
    assert volumes["datadog-keys"]["secret"]["secretName"] == "gpufarm-datadog" and mounts["datadog-keys"]["readOnly"]
    assert env["DD_API_KEY_FILE"]["value"].startswith(mounts["datadog-keys"]["mountPath"] + "/")
    assert env["GPUFARM_POD_METADATA"]["value"].startswith(mounts["pod-metadata"]["mountPath"] + "/")
    security = agent["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"] and set(security["capabilities"]["add"]) == {
        "SYS_PTRACE",
        "DAC_READ_SEARCH",
    }
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    for container in spec["containers"]:
        assert container["resources"]["requests"] and container["resources"]["limits"], container["name"]
        assert all(m.get("readOnly") for m in container["volumeMounts"] if m["name"] != "pod-metadata")


def test_daemonset_env_names_are_ones_the_agent_reads() -> None:
    (ds,) = [d for d in _docs() if d["kind"] == "DaemonSet"]
    agent = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
    assert {e["name"] for e in agent["env"]} - _cli_envvars() == set()


def test_the_sidecar_may_only_read_pods() -> None:
    (role,) = [d for d in _docs() if d["kind"] == "ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    (binding,) = [d for d in _docs() if d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"][0]["name"] == "gpufarm-node" and binding["roleRef"]["name"] == role["metadata"]["name"]
