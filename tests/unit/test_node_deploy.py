"""The systemd unit and the DaemonSet: they parse, and they give the agent what it needs (and no more)."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path
from typing import Any

import click
import yaml
from systemd_unit import read_unit

from gpufarm_node import __version__
from gpufarm_node.cli import main

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "gpufarm-node.service"
DAEMONSET = ROOT / "deploy" / "kubernetes" / "gpufarm-node-daemonset.yaml"


def _unit() -> dict[str, dict[str, list[str]]]:
    return read_unit(UNIT)


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


def test_the_service_account_may_read_pods_get_and_patch_nodes_evict_pods_and_nothing_else() -> None:
    roles = {d["metadata"]["name"]: d["rules"] for d in _docs() if d["kind"] == "ClusterRole"}
    assert roles == {
        "gpufarm-node-pods": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        "gpufarm-node-enforce": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
            # The Eviction API alone (squatting pods under stop-after): no delete, patch or read of pods.
            {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        ],
    }
    bindings = [d for d in _docs() if d["kind"] == "ClusterRoleBinding"]
    assert sorted(b["roleRef"]["name"] for b in bindings) == sorted(roles)
    assert all(
        b["subjects"] == [{"kind": "ServiceAccount", "name": "gpufarm-node", "namespace": "gpufarm"}] for b in bindings
    )
    assert not [d for d in _docs() if d["kind"] in ("Role", "RoleBinding")]


def test_systemd_unit_runs_non_root_and_opens_only_the_nvidia_devices() -> None:
    service = _unit()["Service"]
    assert service["DynamicUser"] == ["yes"] and "User" not in service
    assert set(service["AmbientCapabilities"][0].split()) == set(service["CapabilityBoundingSet"][0].split())
    assert service["DevicePolicy"] == ["closed"] and service["PrivateDevices"] == ["no"]
    allowed = {entry.split()[0] for entry in service["DeviceAllow"]}
    assert {"char-nvidia-frontend", "char-nvidia-caps"} <= allowed
    assert all(entry.startswith("char-nvidia") for entry in allowed)
    # Attribution reads other processes' /proc entries; NVML reads /proc/driver/nvidia.
    assert "ProtectProc" not in service and "ProcSubset" not in service
    assert "pip install ./node" in UNIT.read_text()


def _daemonset_pod() -> dict[str, Any]:
    (ds,) = [d for d in _docs() if d["kind"] == "DaemonSet"]
    pod: dict[str, Any] = ds["spec"]["template"]["spec"]
    return pod


def test_daemonset_containers_are_locked_down() -> None:
    pod = _daemonset_pod()
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in pod["containers"]:
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, container["name"]
        assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            # The only writable mount is an emptyDir; host paths are read-only.
            assert mount.get("readOnly") or "emptyDir" in volume, (container["name"], mount["name"])
    host_paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
    assert host_paths == {"/proc", "/var/lib/kubelet/pod-resources"}


def test_daemonset_agent_is_root_only_for_the_kubelet_socket_and_holds_a_token_only_to_enforce() -> None:
    pod = _daemonset_pod()
    containers = {c["name"]: c for c in pod["containers"]}
    agent, sidecar = containers["agent"], containers["pods"]
    security = agent["securityContext"]
    assert set(security["capabilities"]["add"]) == {"SYS_PTRACE", "DAC_READ_SEARCH"}
    if security.get("runAsUser") == 0:
        # Root is for the root-owned pod-resources socket, so the socket must be what the agent is given.
        assert {m["name"] for m in agent["volumeMounts"]} >= {"pod-resources", "host-proc"}
        assert security["runAsNonRoot"] is False
    else:
        assert security["runAsNonRoot"] is True
    assert sidecar["securityContext"]["runAsNonRoot"] is True and sidecar["securityContext"]["runAsUser"] != 0
    assert "add" not in sidecar["securityContext"]["capabilities"]
    # The API token reaches the sidecar (kubectl), and the agent only for its Kubernetes enforcement.
    assert pod["automountServiceAccountToken"] is False
    token = next(v["name"] for v in pod["volumes"] if "projected" in v)
    holders = {c["name"] for c in pod["containers"] if token in {m["name"] for m in c["volumeMounts"]}}
    enforcing = {e["name"]: e.get("value") for e in agent["env"]}.get("GPUFARM_ENFORCE") == "kubernetes"
    assert holders == ({"pods", "agent"} if enforcing else {"pods"})
    for container in (containers[name] for name in holders):
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == token]
        assert mount["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount" and mount["readOnly"] is True
    if enforcing:
        env = {e["name"]: e for e in agent["env"]}
        assert env["GPUFARM_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


NODE = ROOT / "node"
DOCKERFILE = NODE / "Dockerfile"


def _dockerfile() -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions, stage by stage (ARGs before the first FROM form stage 0)."""
    stages: list[list[tuple[str, str]]] = [[]]
    logical = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        instruction, _, args = logical.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), args.strip()))
        logical = ""
    return stages


def _args(stage: list[tuple[str, str]], instruction: str) -> list[str]:
    return [args for name, args in stage if name == instruction]


def _node_project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((NODE / "pyproject.toml").read_text())["project"]
    # pyproject.toml reads the version from the package (tests/unit/test_distributions.py holds that link).
    return {**project, "version": __version__}


def _daemonset_image() -> str:
    pod = _daemonset_pod()
    image: str = next(c for c in pod["containers"] if c["name"] == "agent")["image"]
    return image


def test_dockerfile_builds_the_image_the_daemonset_runs() -> None:
    project = _node_project()
    image = _daemonset_image()
    assert image.rpartition(":")[2] == project["version"] and image.rpartition(":")[0].endswith("/gpufarm-node")
    header = DOCKERFILE.read_text()
    assert f"docker build -t {image} node/" in header
    preamble, build, final = _dockerfile()
    (base,) = _args(preamble, "ARG")
    assert base.startswith("PYTHON_IMAGE=python:3.12-slim")
    assert _args(build, "FROM") == ["${PYTHON_IMAGE} AS build"] and _args(final, "FROM") == ["${PYTHON_IMAGE}"]
    labels = " ".join(_args(final, "LABEL"))
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    assert _args(final, "ARG") == [f"VERSION={project['version']}"]
    assert f'org.opencontainers.image.licenses="{project["license"]}"' in labels


def test_dockerfile_installs_only_the_node_distribution_with_its_k8s_extra() -> None:
    project = _node_project()
    _, build, final = _dockerfile()
    # The build context is node/: the distribution's pyproject.toml and package, nothing else.
    copied = {shlex.split(args)[0] for args in _args(build, "COPY")}
    assert copied == {"pyproject.toml", "gpufarm_node"} and all((NODE / c).exists() for c in copied)
    ignore = [line for line in (NODE / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert ignore[:3] == ["*", "!pyproject.toml", "!gpufarm_node/"]
    (venv,) = [shlex.split(a)[-1] for a in _args(build, "RUN") if "-m venv" in a]
    (install,) = [a for a in _args(build, "RUN") if " install " in a]
    words = shlex.split(install)
    target = next(w for w in words if w.startswith("/src"))
    assert target == "/src[k8s]" and "k8s" in project["optional-dependencies"]
    assert words[words.index("--python") + 1] == f"{venv}/bin/python"
    # Bytecode for everything but the Datadog client's generated models, compiled in the build stage.
    assert "--no-compile" in words and f"{venv}/bin/python -W ignore::SyntaxWarning -m compileall -q" in install
    # The build runs the installed agent once on fake NVML: a broken install fails the build.
    assert f"{venv}/bin/gpufarm-node --fake" in install
    # The runtime stage takes the venv alone from the build stage.
    assert _args(final, "COPY") == [f"--from=build {venv} {venv}"]
    (entrypoint,) = _args(final, "ENTRYPOINT")
    (script,) = json.loads(entrypoint)
    assert script == f"{venv}/bin/gpufarm-node" and "gpufarm-node" in project["scripts"]


def test_dockerfile_runs_non_root_from_a_read_only_filesystem() -> None:
    _, _, final = _dockerfile()
    (user,) = _args(final, "USER")
    uid, _, gid = user.partition(":")
    # Numeric, so that the kubelet can check runAsNonRoot against it.
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    env = dict(pair.split("=", 1) for args in _args(final, "ENV") for pair in shlex.split(args))
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    # The same NVIDIA runtime settings as the DaemonSet gives the agent.
    agent = next(c for c in _daemonset_pod()["containers"] if c["name"] == "agent")
    daemonset_env = {e["name"]: e.get("value") for e in agent["env"]}
    for name in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"):
        assert env[name] == daemonset_env[name]
    # The sidecar and the image agree on the non-root uid.
    sidecar = next(c for c in _daemonset_pod()["containers"] if c["name"] == "pods")
    assert sidecar["securityContext"]["runAsUser"] == int(uid)
