"""The enforcer (gpufarm-node, without the runtime) and the runtime read the same things the same way: the incident
fields and phases a lease is read from, the reservation's name, and the farm file's enforcement slice, on the
example file and on each kind of bad one (the runtime refuses it as an invalid configuration, the enforcer too)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpufarm.core.config import enforce as runtime_enforce
from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import SLACK_USER_PATTERN
from gpufarm_node.cli import main as node_main
from gpufarm_node.enforce import config as node_config
from gpufarm_node.enforce import leases as node_leases
from gpufarm_node.enforce import slurm_plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "config" / "farm.example.yaml").read_text()


def test_the_incident_fields_and_phases_are_the_runtimes() -> None:
    assert (node_leases.PHASE, node_leases.TEAM, node_leases.ENVIRONMENT) == (f.PHASE, f.TEAM, f.ENVIRONMENT)
    assert (node_leases.REQUESTER, node_leases.EXPIRES_AT, node_leases.HOSTS) == (f.REQUESTER, f.EXPIRES_AT, f.HOSTS)
    assert {Phase.ALLOCATED.value, Phase.IDLE_WARNED.value} == node_leases.HOLDING_PHASES


def test_the_reservation_name_and_the_name_rules_are_the_runtimes() -> None:
    assert slurm_plan.PREFIX == runtime_enforce.RESERVATION_PREFIX
    assert slurm_plan.reservation_name(123) == runtime_enforce.reservation_name(123) == "gpufarm-ir-123"
    assert node_config.SLACK_USER.pattern == SLACK_USER_PATTERN
    assert node_config.CLUSTER_USER.pattern == runtime_enforce.CLUSTER_USER_PATTERN
    assert node_config.SLURM_ACCOUNT.pattern == runtime_enforce.SLURM_ACCOUNT_PATTERN


def test_the_example_farm_is_read_alike() -> None:
    farm = parse_farm(EXAMPLE)
    names = node_config.slurm_names(yaml.safe_load(EXAMPLE))
    assert names.pools == {n for n, e in farm.environments.items() if e.enforce is runtime_enforce.Enforcer.SLURM}
    assert names.pools == {"onprem-hpc"}
    assert dict(names.users) == farm.enforcement.slurm.users
    assert dict(names.accounts) == farm.enforcement.slurm.accounts


def _edited(old: str, new: str) -> str:
    assert old in EXAMPLE
    return EXAMPLE.replace(old, new, 1)


BAD = {
    "an unknown enforcer": _edited("    enforce: slurm\n", "    enforce: pbs\n"),
    "a Slack id that is not one": _edited("      U0000000001: alice\n", "      alice: alice\n"),
    "a cluster user Slurm cannot have": _edited("      U0000000001: alice\n", "      U0000000001: 'Alice Kim'\n"),
    "an account for no team": _edited("      speech: speech\n", "      speech: speech\n      robotics: robotics\n"),
    "a team without an account": _edited("      speech: speech\n", ""),
    "a bad account name": _edited("      nlp: nlp\n", "      nlp: 'nlp;drop'\n"),
}


@pytest.mark.parametrize("text", list(BAD.values()), ids=list(BAD))
def test_a_bad_enforcement_slice_is_refused_by_both(text: str) -> None:
    with pytest.raises(FarmConfigError, match="invalid"):
        parse_farm(text)
    with pytest.raises(node_config.EnforceConfigError):
        node_config.slurm_names(yaml.safe_load(text))


def test_without_a_slurm_pool_no_account_is_needed() -> None:
    text = _edited("    enforce: slurm\n", "").replace("      speech: speech\n", "")
    assert parse_farm(text).enforcement.slurm.accounts == {"nlp": "nlp", "vision": "vision"}
    assert node_config.slurm_names(yaml.safe_load(text)).pools == frozenset()


def test_the_enforcer_refuses_a_bad_farm_file_with_exit_2_and_names_the_key(tmp_path: Path) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text(BAD["a team without an account"])
    env = {"DD_API_KEY": "k", "DD_APP_KEY": "a", "GPUFARM_DATADOG_HOST": "http://127.0.0.1:9"}
    result = CliRunner().invoke(node_main, ["enforce", "slurm", "--farm", str(farm), "--once"], env=env)
    assert result.exit_code == 2, result.output
    assert "enforcement.slurm.accounts: team 'speech' has no Slurm account" in result.output
    missing = CliRunner().invoke(node_main, ["enforce", "slurm", "--farm", str(tmp_path / "none.yaml")], env=env)
    assert missing.exit_code == 2 and "cannot read the farm file" in missing.output


def test_the_enforcer_needs_an_application_key_to_read_incidents(tmp_path: Path) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text(EXAMPLE)
    env = {"DD_API_KEY": "k", "DD_APP_KEY": "", "GPUFARM_DATADOG_HOST": "http://127.0.0.1:9"}
    result = CliRunner().invoke(node_main, ["enforce", "slurm", "--farm", str(farm), "--once"], env=env)
    assert result.exit_code == 2 and "DD_APP_KEY" in result.output
    assert not re.search(r"\bk\b", result.output.replace("key", ""))


def test_the_submit_hint_names_the_reservation_only_on_an_enforced_pool() -> None:
    hint = runtime_enforce.submit_hint(runtime_enforce.Enforcer.SLURM, 123)
    assert hint is not None and "sbatch --reservation=gpufarm-ir-123" in hint
    assert runtime_enforce.submit_hint(runtime_enforce.Enforcer.NONE, 123) is None


def test_the_enforcers_cluster_tag_is_checked(tmp_path: Path) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text(EXAMPLE)
    args = ["enforce", "slurm", "--farm", str(farm), "--once", "--cluster", "hpc a;x"]
    result = CliRunner().invoke(node_main, args, env={"DD_API_KEY": "k", "DD_APP_KEY": "a"})
    assert result.exit_code == 2 and "--cluster" in result.output


def test_the_kubernetes_label_and_taint_are_the_runtimes_and_the_pod_labels() -> None:
    from gpufarm_node.attribution import IR_LABEL
    from gpufarm_node.enforce import kube_plan

    assert kube_plan.LABEL == runtime_enforce.NODE_LABEL == IR_LABEL == "gpufarm.io/ir"
    assert kube_plan.TAINT == runtime_enforce.NODE_TAINT == "gpufarm.io/lease"
    assert "kubernetes" in node_config.ENFORCERS and set(node_config.ENFORCERS) == {
        e.value for e in runtime_enforce.Enforcer
    }


def test_a_kubernetes_pool_is_read_alike_and_needs_no_slurm_account() -> None:
    farm = parse_farm(EXAMPLE)
    kube = {n for n, e in farm.environments.items() if e.enforce is runtime_enforce.Enforcer.KUBERNETES}
    assert kube == {"cloud-aws", "shared-slices"}
    assert "onprem-hpc" not in kube and node_config.slurm_names(yaml.safe_load(EXAMPLE)).pools == {"onprem-hpc"}
    text = _edited("    enforce: slurm\n", "    enforce: kubernetes\n").replace("      speech: speech\n", "")
    assert parse_farm(text).environments["onprem-hpc"].enforce is runtime_enforce.Enforcer.KUBERNETES
    assert node_config.slurm_names(yaml.safe_load(text)).pools == frozenset()


def test_the_kubernetes_hint_gives_the_toleration_and_selector_or_on_a_shared_pool_the_label() -> None:
    dedicated = runtime_enforce.submit_hint(runtime_enforce.Enforcer.KUBERNETES, 123)
    assert dedicated is not None
    snippet = yaml.safe_load(dedicated.split("```")[1])
    assert snippet["spec"]["nodeSelector"] == {"gpufarm.io/ir": "ir-123"}
    assert snippet["spec"]["tolerations"] == [
        {"key": "gpufarm.io/lease", "operator": "Equal", "value": "ir-123", "effect": "NoSchedule"}
    ]
    assert snippet["metadata"]["labels"] == {"gpufarm.io/ir": "ir-123"}
    shared = runtime_enforce.submit_hint(runtime_enforce.Enforcer.KUBERNETES, 123, shared=True)
    assert shared is not None and yaml.safe_load(shared.split("```")[1]) == {
        "metadata": {"labels": {"gpufarm.io/ir": "ir-123"}}
    }
    assert "toleration" not in shared
