"""What doctor calls, as ports: the command (gpufarm.cli.doctor) passes the real adapters, tests pass them or
fakes. gpufarm.setup sits below the adapters, so nothing here imports one."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.kernel.model import IncidentRecord
from gpufarm.core.kernel.ports import HostTags
from gpufarm.setup.api import SetupApi


class AdminApi(SetupApi, Protocol):
    """`gpufarm datadog apply`'s calls (monitor validation among them) and the keys' checks
    (gpufarm.adapters.datadog_admin)."""

    def api_key_valid(self) -> bool:
        """Whether Datadog takes the API key."""

    def current_user(self) -> dict[str, Any] | None:
        """The application key's user with its roles and permissions; None when the key is refused."""


class SearchCheck(Protocol):
    """One search form's outcome (gpufarm.adapters.datadog_incidents.SearchCheck)."""

    @property
    def form(self) -> str:
        """Which search form."""

    @property
    def status(self) -> str:
        """confirmed, fell back or broken."""

    @property
    def detail(self) -> str:
        """What was seen."""


class ProbeStore(Protocol):
    """gpufarm's incidents as the probe uses them (gpufarm.adapters.datadog_incidents.DatadogIncidents)."""

    @property
    def incident_type_id(self) -> str:
        """The id of gpufarm's incident type."""

    def create(self, title: str, fields: Mapping[str, object]) -> IncidentRecord:
        """Create one of gpufarm's incidents."""

    def get(self, incident_id: str) -> IncidentRecord:
        """Read one of gpufarm's incidents."""

    def update(self, incident_id: str, fields: Mapping[str, object]) -> IncidentRecord:
        """Write some fields."""

    def delete(self, incident_id: str) -> None:
        """Delete one of gpufarm's incidents."""

    def find_by_request_id(self, request_id: str) -> IncidentRecord | None:
        """The incident created for a request id."""


class SearchForms(Protocol):
    """Every search form gpufarm uses, tried on the org (DatadogIncidents.check_search_forms)."""

    def check_search_forms(self, sample: IncidentRecord | None = None) -> Sequence[SearchCheck]:
        """One outcome per form, probed around `sample` (default: gpufarm's newest incident)."""


class HostSources(HostTags, Protocol):
    """Host tags, and the host list's sources as Datadog spells them (gpufarm.adapters.datadog.DatadogGateway)."""

    def listed_sources(self, host: str) -> dict[str, tuple[str, ...]] | None:
        """The host list's tags_by_source for that host, keys as Datadog spells them; None when not listed."""


class SlackProbe(Protocol):
    """What the Slack checks ask (gpufarm.adapters.slack.SlackChat)."""

    def token_scopes(self) -> frozenset[str] | None:
        """The bot token's scopes; None when Slack does not say."""

    def is_member(self, channel: str) -> bool:
        """Whether the bot is in a channel."""


# How often a wait looks again, in seconds.
POLL_S = 0.5


@dataclass(frozen=True)
class Timing:
    """How the check waits: its bound, the clock and the sleep (tests pass their own)."""

    wait_s: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


# (url, body to POST or None for a GET, its content type) -> (HTTP status, start of the answer's body); raises
# UpstreamError when nothing answers (gpufarm.adapters.aws.function_url_answer).
UrlAnswer = Callable[[str, bytes | None, str], tuple[int, str]]


@dataclass(frozen=True)
class Collaborators:
    """The adapters doctor checks through; None where the settings cannot build one (its check says why)."""

    admin: AdminApi
    incidents: ProbeStore
    hosts: HostSources
    searches: SearchForms
    slack: SlackProbe | None
    url_answer: UrlAnswer
    # Why `slack` is None (no bot token, ...); shown on the Slack line.
    slack_missing: str = ""


@dataclass(frozen=True)
class Options:
    """What to check, from the settings and the command's options."""

    # Where Datadog is (for messages): the API base URL.
    datadog_url: str
    incident_type: str
    farm: FarmConfig | None
    # The host a scratch tag is written to and read back from; None: that check is skipped.
    host: str | None = None
    # How long the webhook round trip (and the tag's appearance in the host list) is awaited, in seconds.
    wait_s: float = 60.0
    # The Function URLs (None: not configured; the incident and idle webhooks default to what Datadog calls).
    ingress_url: str | None = None
    incident_webhook_url: str | None = None
    idle_webhook_url: str | None = None
    profile_pages_url: str | None = None
    profile_upload_url: str | None = None
    operators_channel: str | None = None
