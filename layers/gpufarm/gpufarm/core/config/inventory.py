"""The farm YAML's `inventory:` section: which inventory sources a sync reads, and when a quiet node is down.

Every source is optional. gpufarm-node's own registrations (Datadog hosts tagged `gpufarm:managed`) are always
read: they are what allocation places on. Besides them:

- `aws`: EC2 GPU instances, capacity reservations and the On-Demand vCPU quotas, per region;
- `azure`: NC / ND / NV virtual machines and the regional family core quotas, per subscription and location;
- `static`: hosts listed by hand that run no agent yet;
- `datadog_agent`: hosts the Datadog Agent's GPU check reports (`gpu.device.total` per host and `gpu_device`) on
  the pools whose `metrics_source` is `datadog-agent` (gpufarm.core.inventory.agent_source), gpufarm tags or not.

Like the rest of the farm file, the section is validated strictly: an unknown key, an environment the farm does
not define or a model it does not list fails loudly with the key's path.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gpufarm.core.kernel.model import GPU_MODEL_PATTERN, Name

_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$")
_LOCATION_RE = re.compile(r"^[a-z][a-z0-9]{1,39}$")
_SUBSCRIPTION_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# EC2 instance-type filter values: a family and a size, `*` as the wildcard (p5.48xlarge, p5.*, g6e.*).
_TYPE_PATTERN_RE = re.compile(r"^[a-z][a-z0-9-]{0,15}\.[a-z0-9*-]{1,20}$")
_TAG_KEY_RE = re.compile(r"^[A-Za-z0-9 _.:/=+@-]{1,128}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}$")
_SIZE_PREFIX_RE = re.compile(r"^Standard_[A-Z]{1,4}$")
_MODEL_RE = re.compile(GPU_MODEL_PATTERN)
# One host tag of a metrics scope (`environment:cloud-aws`, `kube_cluster_name:gpu-a`); no operators, no spaces.
_SCOPE_TAG_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_./-]{0,99}:[A-Za-z0-9_./:-]{1,100}$")
# The Agent GPU check's device name as its `gpu_device` tag carries it (nvidia_h100_80gb_hbm3).
_DEVICE_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,99}$")

# GPU instance families of EC2 (every P and G family), as instance-type filter patterns.
DEFAULT_AWS_TYPES = (
    "p3.*",
    "p3dn.*",
    "p4d.*",
    "p4de.*",
    "p5.*",
    "p5e.*",
    "p5en.*",
    "p6-b200.*",
    "g4dn.*",
    "g5.*",
    "g6.*",
    "g6e.*",
)
# Azure's GPU VM size series: NC (compute), ND (deep learning), NV (visualisation).
DEFAULT_AZURE_PREFIXES = ("Standard_NC", "Standard_ND", "Standard_NV")
MAX_REGIONS = 32
MAX_STATIC = 2000


def _matching(pattern: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"{value[:80]!r} is not {what}")
        return value

    return AfterValidator(check)


def _model(value: str) -> str:
    model = value.strip().upper()
    if not _MODEL_RE.match(model):
        raise ValueError(f"{value[:40]!r} is not a GPU model name")
    return model


AwsRegion = Annotated[str, _matching(_REGION_RE, "an AWS region (us-east-1)")]
AzureLocation = Annotated[str, _matching(_LOCATION_RE, "an Azure location (eastus)")]
Subscription = Annotated[str, _matching(_SUBSCRIPTION_RE, "an Azure subscription id (a lowercase UUID)")]
TypePattern = Annotated[str, _matching(_TYPE_PATTERN_RE, "an EC2 instance-type pattern (p5.*, g6e.12xlarge)")]
TagKey = Annotated[str, _matching(_TAG_KEY_RE, "a tag key (1-128 letters, digits, spaces, _.:/=+@-)")]
HostName = Annotated[str, _matching(_HOST_RE, "a host name")]
SizePrefix = Annotated[str, _matching(_SIZE_PREFIX_RE, "an Azure VM size prefix (Standard_ND)")]
ModelName = Annotated[str, AfterValidator(_model)]
ScopeTag = Annotated[str, _matching(_SCOPE_TAG_RE, "a host tag (key:value, no spaces)")]
DeviceName = Annotated[str, _matching(_DEVICE_RE, "a gpu_device tag value (lowercase, nvidia_h100_80gb_hbm3)")]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CloudTags(_Strict):
    """How a cloud instance's tags place it: the tag keys naming its environment and cluster."""

    environment_tag: TagKey = "gpufarm-environment"
    cluster_tag: TagKey = "gpufarm-cluster"
    # The environment of an instance whose tag is missing or names no environment of the farm (None: unassigned).
    default_environment: Name | None = None


class AwsInventory(CloudTags):
    """EC2: GPU instances (filtered by type), their GPU model and count, reservations and On-Demand vCPU quotas."""

    enabled: bool = True
    regions: tuple[AwsRegion, ...] = Field(min_length=1, max_length=MAX_REGIONS)
    instance_types: tuple[TypePattern, ...] = Field(default=DEFAULT_AWS_TYPES, min_length=1, max_length=200)
    capacity_reservations: bool = True
    quotas: bool = True
    # botocore's standard retry mode: retries per call (throttling included, with backoff) before the step is skipped.
    max_retries: int = Field(default=4, ge=0, le=10)


class AzureInventory(CloudTags):
    """Azure: GPU virtual machines per subscription and location, and each location's family core quotas."""

    enabled: bool = True
    subscriptions: tuple[Subscription, ...] = Field(min_length=1, max_length=MAX_REGIONS)
    locations: tuple[AzureLocation, ...] = Field(min_length=1, max_length=MAX_REGIONS)
    size_prefixes: tuple[SizePrefix, ...] = Field(default=DEFAULT_AZURE_PREFIXES, min_length=1, max_length=16)
    quotas: bool = True
    # azure-core's RetryPolicy: total retries per request (throttling included) before the location is skipped.
    max_retries: int = Field(default=3, ge=0, le=10)


class StaticHost(_Strict):
    """A host listed by hand (it runs no agent yet): counted in the inventory and reported as without an agent."""

    name: HostName
    environment: Name
    cluster: Name | None = None
    gpu_model: ModelName
    gpu_count: int = Field(ge=1, le=64)


class DatadogAgentInventory(_Strict):
    """Hosts the Datadog Agent's GPU check reports, on the pools whose metrics_source is `datadog-agent`.

    One metrics query per pool reads every host of the pool with its GPUs and their device name (the model), and
    one more per sync, over `down_after_minutes`, which of them still report (gpufarm.core.inventory.agent_source).
    """

    enabled: bool = True
    # A host whose check reported within this window is inventory; one that reported in it but not within
    # inventory.down_after_minutes is down. Past it the host is gone, as Datadog's host list forgets a silent host.
    lookback_minutes: int = Field(default=180, ge=10, le=7 * 24 * 60)
    # Per pool, the host tags that find its Agent hosts (AND-ed); a pool not named here: `environment:<pool>`.
    scopes: dict[Name, tuple[ScopeTag, ...]] = Field(default_factory=dict, max_length=MAX_REGIONS)
    # gpu_device values whose name does not say the farm's model (the model is otherwise read from the name:
    # `nvidia_h100_80gb_hbm3` is an H100); a device neither names is unknown, never another model.
    device_models: dict[DeviceName, ModelName] = Field(default_factory=dict, max_length=256)

    def scope(self, pool: str) -> tuple[str, ...]:
        """The host tags that find a pool's Agent hosts."""
        return self.scopes.get(pool) or (f"environment:{pool}",)


class InventorySettings(_Strict):
    """The `inventory:` section of the farm file."""

    # A registered node that sent no registration or metrics for this long is down: excluded from allocation and
    # counted as down. None: never (the host list itself drops hosts silent for three hours).
    down_after_minutes: int | None = Field(default=None, ge=5, le=24 * 60)
    aws: AwsInventory | None = None
    azure: AzureInventory | None = None
    static: tuple[StaticHost, ...] = Field(default=(), max_length=MAX_STATIC)
    datadog_agent: DatadogAgentInventory | None = None

    def problems(self, environments: dict[str, tuple[str, ...]], agent_pools: Collection[str] = ()) -> list[str]:
        """What in this section names an environment or model the farm lacks (environment -> its models).

        `agent_pools` are the environments whose metrics_source is `datadog-agent`.
        """
        out: list[str] = self._agent_problems(environments, agent_pools)
        named = [
            ("aws.default_environment", self.aws.default_environment if self.aws else None),
            ("azure.default_environment", self.azure.default_environment if self.azure else None),
        ]
        out += [
            f"inventory.{key}: '{env}' is not an environment" for key, env in named if env and env not in environments
        ]
        seen: set[str] = set()
        for i, host in enumerate(self.static):
            where = f"inventory.static.{i}"
            if host.name in seen:
                out.append(f"{where}.name: '{host.name}' is listed twice")
            seen.add(host.name)
            models = environments.get(host.environment)
            if models is None:
                out.append(f"{where}.environment: '{host.environment}' is not an environment")
            elif host.gpu_model not in models:
                out.append(f"{where}.gpu_model: '{host.environment}' offers no '{host.gpu_model}'")
        return out

    def _agent_problems(self, environments: dict[str, tuple[str, ...]], agent_pools: Collection[str]) -> list[str]:
        agent = self.datadog_agent
        if agent is None or not agent.enabled:
            return []
        out: list[str] = []
        if not agent_pools:
            out.append("inventory.datadog_agent: no environment has metrics_source: datadog-agent")
        out += [
            f"inventory.datadog_agent.scopes.{pool}: '{pool}' is not an environment with metrics_source: datadog-agent"
            for pool in agent.scopes
            if pool not in agent_pools
        ]
        out += [f"inventory.datadog_agent.scopes.{pool}: empty" for pool, tags in agent.scopes.items() if not tags]
        models = {m for ms in environments.values() for m in ms}
        out += [
            f"inventory.datadog_agent.device_models.{device}: '{model}' is not a model of the farm"
            for device, model in agent.device_models.items()
            if model not in models
        ]
        if self.down_after_minutes is not None and agent.lookback_minutes <= self.down_after_minutes:
            out.append(
                f"inventory.datadog_agent.lookback_minutes: {agent.lookback_minutes} must exceed "
                f"inventory.down_after_minutes ({self.down_after_minutes}), or no silent host is ever seen down"
            )
        return out
