"""The Slurm enforcer's systemd unit: it parses, runs `gpufarm-node enforce slurm` with options the command takes,
passes only variables the command reads, holds no key, and is hardened like the agent's."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
from systemd_unit import read_unit

from gpufarm_node.cli import main
from gpufarm_node.enforce.cli import slurm

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "gpufarm-enforce-slurm.service"


def _unit() -> dict[str, dict[str, list[str]]]:
    return read_unit(UNIT)


def test_the_unit_runs_the_enforcer_with_options_it_takes() -> None:
    service = _unit()["Service"]
    argv = shlex.split(service["ExecStart"][0])
    assert argv[0].endswith("/gpufarm-node") and argv[1:3] == ["enforce", "slurm"]
    assert isinstance(main, click.Group) and main.commands["enforce"].commands["slurm"] is slurm  # type: ignore[attr-defined]
    with slurm.make_context("slurm", [*argv[3:], "--farm", "/etc/gpufarm/farm.yaml"]) as ctx:
        assert ctx.params["interval"] == 20


def test_the_unit_passes_only_what_the_enforcer_reads_and_no_key() -> None:
    service = _unit()["Service"]
    read = {"DD_API_KEY_FILE", "DD_APP_KEY_FILE", "PYTHONUNBUFFERED"}
    for param in slurm.params:
        if isinstance(param, click.Option) and isinstance(param.envvar, str):
            read.add(param.envvar)
    assert {e.split("=")[0] for e in service["Environment"]} <= read
    assert {c.split(":")[0] for c in service["LoadCredential"]} == {"dd_api_key", "dd_app_key"}
    assert "DD_API_KEY=" not in UNIT.read_text().replace("$DD_API_KEY", "")
    assert service["Restart"] == ["always"] and service["RestartPreventExitStatus"] == ["2"]
    for key in ("NoNewPrivileges", "ProtectKernelTunables", "RestrictSUIDSGID", "PrivateTmp", "PrivateDevices"):
        assert service[key] == ["yes"], key
    assert service["ProtectSystem"] == ["strict"] and service["CapabilityBoundingSet"] == [""]
    assert _unit()["Install"]["WantedBy"] == ["multi-user.target"]
