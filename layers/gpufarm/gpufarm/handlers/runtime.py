"""Collaborators built once per container from Settings, and domain errors mapped to words for people.

Everything is built lazily: the Slack ingress touches only the signature check, the farm file and the invoker,
so it never imports datadog_api_client on that path (docs/design.md, "Slack's 3 seconds"). The runtime is rebuilt
when the process environment changes, which happens only under the local function host and in tests (several
local environments in one process); a Lambda container builds it once.

Seams: a development tool may install a provider (`install_seams`) that replaces production collaborators (the
clock, the invoker, the queue, a default farm file) for the environments it recognises. The local function host
of `gpufarm-sandbox` does; the runtime itself knows nothing of the sandbox.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

# Handlers catch rt.ConfigurationError (a missing setting, secret, secret key or parameter): an explicit re-export.
from gpufarm.config import ConfigurationError as ConfigurationError  # noqa: PLC0414
from gpufarm.config import Settings
from gpufarm.core.kernel.errors import Conflict, GpufarmError, NotAllowed, NotFound, UpstreamError, ValidationFailed
from gpufarm.handlers.lazy_ports import LazyEvents, LazyQuery
from gpufarm.handlers.lazy_ports import SystemClock as SystemClock  # noqa: PLC0414 - its home before

if TYPE_CHECKING:
    from gpufarm.adapters.datadog import DatadogGateway
    from gpufarm.adapters.datadog_dashboards import ProjectDashboardEditor
    from gpufarm.adapters.slack import SlackChat
    from gpufarm.adapters.slack_signature import SignatureCheck
    from gpufarm.core.chat.links import DashboardLookup
    from gpufarm.core.config.farm import FarmConfig
    from gpufarm.core.config.farm_view import FarmView
    from gpufarm.core.kernel.ports import (
        AsyncInvoker,
        Clock,
        HostTags,
        IncidentStore,
        InventorySource,
        LeaseReads,
        MonitorStates,
        WorkQueue,
    )
    from gpufarm.core.money.prices import PriceBook, PriceFeed
    from gpufarm.core.service import GpuFarm

log = logging.getLogger(__name__)

QUEUE_URL_ENV = "GPUFARM_ALLOCATION_QUEUE_URL"
# Only these variables shape the runtime; a change in any of them means "another environment".
_ENV_PREFIXES = ("GPUFARM_", "DD_", "SLACK_")
# Slack calls on the ingress must leave room inside Slack's 3 seconds.
INGRESS_SLACK_TIMEOUT_S = 2.0
# Datadog waits 15 s for a webhook answer and retries a 5xx itself (docs/datadog.md): on that path every call is
# made once with a short timeout, so a slow upstream becomes a 503 (and a redelivery) instead of a lost answer.
WEBHOOK_HTTP_TIMEOUT_S = 3.0
# A seam provider: given the settings and the environment, the collaborators to use instead of production ones
# ("clock", "invoker", "queue", "farm_config" (a file path)), or {} for an environment it does not know.
SeamProvider = Callable[[Settings, Mapping[str, str]], Mapping[str, Any]]


class Runtime:
    """Lazily built collaborators for one environment."""

    def __init__(self, settings: Settings, environ: dict[str, str]) -> None:
        self.settings = settings
        self.environ = environ
        self._lock = threading.RLock()
        seams: dict[str, Any] = {}
        for provider in _seam_providers:
            seams.update(provider(settings, environ))
        farm_config = seams.pop("farm_config", None)
        if farm_config and not settings.farm_config and not settings.farm_config_parameter:
            self.settings = settings.replace(farm_config=str(farm_config))
        self._parts: dict[str, Any] = {**seams, **_overrides}
        self._farm: tuple[str, FarmConfig] | None = None

    def _get(self, name: str, build: Any) -> Any:
        with self._lock:
            if name not in self._parts:
                self._parts[name] = build()
            return self._parts[name]

    def clock(self) -> Clock:
        """Wall time (a seam may put the sandbox's clock here)."""
        clock: Clock = self._get("clock", SystemClock)
        return clock

    def signature_check(self) -> SignatureCheck:
        """Slack request verification with the signing secret, on this runtime's clock."""

        def build() -> SignatureCheck:
            from gpufarm.adapters.slack_signature import SignatureCheck

            secret = self.settings.require("slack_signing_secret")
            clock = self.clock()
            return SignatureCheck(secret, clock=lambda: clock.now().timestamp())

        check: SignatureCheck = self._get("signature_check", build)
        return check

    def chat(self) -> SlackChat:
        """Slack Web API and response_url."""

        def build() -> SlackChat:
            from gpufarm.adapters.slack import SlackChat

            self._require_bot_token()
            return SlackChat.from_settings(self.settings)

        chat: SlackChat = self._get("chat", build)
        return chat

    def _require_bot_token(self) -> None:
        self.settings.require("slack_bot_token")

    def ingress_chat(self) -> SlackChat:
        """Slack for the ingress: short timeouts, no long retry waits (views.open must finish inside 3 s)."""

        def build() -> SlackChat:
            from gpufarm.adapters.slack import SlackChat

            self._require_bot_token()
            return SlackChat.from_settings(
                self.settings, timeout=INGRESS_SLACK_TIMEOUT_S, max_retries=1, max_retry_wait=0.5
            )

        chat: SlackChat = self._get("ingress_chat", build)
        return chat

    def gateway(self) -> DatadogGateway:
        """Datadog: incidents, hosts and tags, metrics."""

        def build() -> DatadogGateway:
            from gpufarm.adapters.datadog import DatadogGateway

            return DatadogGateway(self.settings)

        gateway: DatadogGateway = self._get("gateway", build)
        return gateway

    def invoker(self) -> AsyncInvoker:
        """Async hand-off to another function (Lambda, or the local function host)."""

        def build() -> AsyncInvoker:
            from gpufarm.adapters.aws import make_invoker

            return make_invoker(self.settings)

        invoker: AsyncInvoker = self._get("invoker", build)
        return invoker

    def for_webhook(self) -> Runtime:
        """This environment on the webhook budget: WEBHOOK_HTTP_TIMEOUT_S per call, no client retries."""

        def build() -> Runtime:
            budget = {"http_timeout": WEBHOOK_HTTP_TIMEOUT_S, "max_retries": 0}
            return Runtime(self.settings.replace(**budget), self.environ)

        bounded: Runtime = self._get("for_webhook", build)
        return bounded

    def queue(self) -> WorkQueue | None:
        """The allocation FIFO queue when this function is wired to it."""

        def build() -> WorkQueue | None:
            url = self.environ.get(QUEUE_URL_ENV, "").strip()
            if not url:
                return None
            from gpufarm.adapters.aws import make_queue

            return make_queue(self.settings, url)

        queue: WorkQueue | None = self._get("queue", build)
        return queue

    def farm(self) -> FarmConfig:
        """The farm configuration (SSM in Lambda, a file locally), parsed once per distinct text."""
        override = self._parts.get("farm")
        if override is not None:
            farm: FarmConfig = override
            return farm
        text = self._farm_text()
        with self._lock:
            if self._farm is None or self._farm[0] != text:
                self._farm = (text, parsed_farm(text))
            return self._farm[1]

    def farm_view(self) -> FarmView:
        """The farm as reports read it (gpufarm.core.config.farm_view): the farm set for this runtime, or the
        configured farm's text through its kept validated dump (gpufarm.adapters.farm_dump)."""
        from gpufarm.adapters.farm_dump import farm_view
        from gpufarm.core.config.farm_view import FarmView

        override = self._parts.get("farm")
        return FarmView.of(override) if override is not None else farm_view(self._farm_text())

    def _farm_text(self) -> str:
        from gpufarm.adapters.aws import load_farm_text

        return load_farm_text(self.settings)

    def worker_function(self) -> str:
        """The slack_worker function name (GPUFARM_WORKER_FUNCTION)."""
        name = self.settings.worker_function
        if not name:
            raise ConfigurationError("GPUFARM_WORKER_FUNCTION is not set")
        return name

    def service(self) -> GpuFarm:
        """The lifecycle use cases wired to this environment's adapters (farm re-read when it changes)."""
        from gpufarm.core.chat.links import Links
        from gpufarm.core.service import GpuFarm

        farm = self.farm()
        with self._lock:
            svc: GpuFarm | None = self._parts.get("service")
            if svc is None:
                svc = GpuFarm(
                    incidents=self._port("incidents"),
                    hosts=self._port("hosts"),
                    chat=self.chat(),
                    clock=self.clock(),
                    farm=farm,
                    operators_usergroup=self.settings.operators_usergroup,
                    operators_channel=self.settings.operators_channel,
                    metrics=self._port("metrics"),
                    queue=self.queue(),
                    links=Links.for_site(
                        self.settings.datadog_site, self.settings.public_url, self._project_dashboard()
                    ),
                    usage=LazyQuery(lambda: self._port("metrics_query")),
                    events=self._events(),
                    prices=self.prices(),
                    price_feed=self.price_feed(),
                )
                self._parts["service"] = svc
            elif svc.context.farm is not farm:
                svc.context.farm = farm
                svc.context.operators_usergroup = self.settings.operators_usergroup or farm.operators_usergroup
                svc.context.operators_channel = self.settings.operators_channel or farm.operators_channel
            svc.context.sources = self.inventory_sources(farm)
            return svc

    def prices(self) -> PriceBook | None:
        """The clouds' list prices last read (the cache GPUFARM_PRICE_CACHE names: gpufarm.adapters.price_cache),
        or an override's; None: the rate card has the farm file's written prices only. Building it reads nothing."""

        def build() -> PriceBook | None:
            if not self.settings.price_cache:
                return None
            from gpufarm.adapters.price_cache import PriceCache

            return PriceCache(self.settings.price_cache, self.settings)

        book: PriceBook | None = self._get("prices", build)
        return book

    def price_feed(self) -> PriceFeed | None:
        """What the sync refreshes the cached prices with: the clouds' price lists (a seam's or an override's
        `price_lists`, else AWS's and Azure's) and the cache; None without a cache."""

        def build() -> PriceFeed | None:
            from gpufarm.adapters.price_cache import PriceCache
            from gpufarm.core.money.prices import PriceFeed

            cache = self.prices()
            if not isinstance(cache, PriceCache):
                return None
            lists = self._parts.get("price_lists")
            if lists is None:
                from gpufarm.adapters.price_lists import cloud_price_lists

                settings = self.settings
                lists = cloud_price_lists(attempts=settings.max_retries + 1, http_timeout=settings.http_timeout)
            return PriceFeed(lists, cache)

        feed: PriceFeed | None = self._get("price_feed", build)
        return feed

    def inventory_sources(self, farm: FarmConfig) -> tuple[InventorySource, ...]:
        """The farm file's cloud inventory sources (inventory.aws, inventory.azure), rebuilt when the farm changes.

        A seam or an override named `inventory_sources` (farm -> sources) builds them instead: the local host's
        moto-backed AWS and stubbed Azure, a benchmark's. Building one reads nothing: a source reads when the
        sync asks it to (gpufarm.core.inventory.sources).
        """
        with self._lock:
            built: tuple[FarmConfig, tuple[InventorySource, ...]] | None = self._parts.get("built_inventory_sources")
            if built is not None and built[0] is farm:
                return built[1]
            factory = self._parts.get("inventory_sources")
            sources = tuple(factory(farm)) if factory is not None else cloud_sources(farm, self.settings.http_timeout)
            self._parts["built_inventory_sources"] = (farm, sources)
            return sources

    def incidents(self) -> IncidentStore:
        """Incidents (Datadog), for handlers that read one before queueing work."""
        store: IncidentStore = self._port("incidents")
        return store

    def hosts(self) -> HostTags:
        """Hosts and their tags (Datadog), for the reports that read the inventory (`gpufarm report --outlook`)."""
        hosts: HostTags = self._port("hosts")
        return hosts

    def lease_reads(self) -> IncidentStore | LeaseReads:
        """Leases as reports read them: the incidents override when a test or seam set one, else Datadog over plain
        HTTP (gpufarm.adapters.datadog_reads: neither the client library nor a model per incident)."""
        if "incidents" in self._parts:
            store: IncidentStore = self._parts["incidents"]
            return store

        def build() -> LeaseReads:
            from gpufarm.adapters.datadog_reads import DatadogLeaseReads

            return DatadogLeaseReads(self.settings)

        reads: LeaseReads = self._get("lease_reads", build)
        return reads

    def monitor_states(self) -> MonitorStates:
        """What Datadog's monitors say of a group now (the idle webhook's check against stale alerts)."""
        states: MonitorStates = self._port("monitor_states")
        return states

    def _events(self) -> Any:
        """The event stream: the override, else the gateway's (built on the first event), none when a test
        replaced the metrics port without giving one."""
        if "events" in self._parts:
            return self._parts["events"]
        return None if "metrics" in self._parts else LazyEvents(self.gateway)

    def _project_dashboard(self) -> DashboardLookup | None:
        """The project dashboard's id for the links of messages, read from Datadog once per container
        (gpufarm.adapters.datadog_dashboards); an override's when one is set, none when a test replaced the
        incidents port without giving one (no Datadog to read)."""
        if "project_dashboard" in self._parts:
            lookup: DashboardLookup | None = self._parts["project_dashboard"]
            return lookup
        if "incidents" in self._parts:
            return None

        def build() -> DashboardLookup:
            from gpufarm.adapters.datadog_dashboards import ProjectDashboard

            return ProjectDashboard(self.settings)

        built: DashboardLookup = self._get("project_dashboard", build)
        return built

    def dashboard_editor(self) -> ProjectDashboardEditor | None:
        """The project dashboard's definition, for the sync's re-signing of its page links: the override's when
        one is set, none when a test replaced the incidents port without giving one (no Datadog to write)."""
        if "dashboard_editor" in self._parts:
            given: ProjectDashboardEditor | None = self._parts["dashboard_editor"]
            return given
        if "incidents" in self._parts:
            return None

        def build() -> ProjectDashboardEditor:
            from gpufarm.adapters.datadog_dashboards import ProjectDashboardEditor

            return ProjectDashboardEditor(self.settings)

        built: ProjectDashboardEditor = self._get("dashboard_editor", build)
        return built

    def _port(self, name: str) -> Any:
        """A Datadog-backed port: the override when a test set one, else the gateway."""
        return self._parts[name] if name in self._parts else self.gateway()


def cloud_sources(farm: FarmConfig, http_timeout: float) -> tuple[InventorySource, ...]:
    """The AWS and Azure inventory sources the farm file enables, on their production clients."""
    settings = farm.inventory
    sources: list[InventorySource] = []
    if settings.aws is not None and settings.aws.enabled:
        from gpufarm.adapters.aws_inventory import AwsInventorySource

        sources.append(AwsInventorySource(settings.aws, farm.environments, http_timeout=http_timeout))
    if settings.azure is not None and settings.azure.enabled:
        from gpufarm.adapters.azure_inventory import AzureInventorySource

        timeouts = {"connection_timeout": 5.0, "read_timeout": http_timeout}
        sources.append(AzureInventorySource(settings.azure, farm.environments, client_options=timeouts))
    return tuple(sources)


_farm_lock = threading.Lock()
# The farm parsed last, with its text: a runtime built again (settings read again, a SnapStart restore, another
# environment of the local host) whose farm text is unchanged takes it instead of parsing the YAML and validating
# it again. A FarmConfig is frozen, so runtimes may share one.
_last_farm: tuple[str, FarmConfig] | None = None


def parsed_farm(text: str) -> FarmConfig:
    """The farm configuration in `text`, parsed once per distinct text (FarmConfigError when it is invalid)."""
    global _last_farm  # noqa: PLW0603 - one parsed farm per container is the point
    with _farm_lock:
        if _last_farm is not None and _last_farm[0] == text:
            return _last_farm[1]
    from gpufarm.core.config.farm import parse_farm

    farm = parse_farm(text)
    with _farm_lock:
        _last_farm = (text, farm)
    return farm


class NotConfigured(ConfigurationError):
    """What the caller of a misconfigured function learns: only that (the function's log line names what)."""

    def __init__(self) -> None:
        super().__init__("gpufarm is not configured; the function's log names what is missing")


def misconfigured(function: str, exc: ConfigurationError) -> NotConfigured:
    """Log the one line that names what is missing (never a value) and return the detail-free error to raise."""
    if isinstance(exc, NotConfigured):
        return exc
    log.error("%s misconfigured: %s", function, exc)
    return NotConfigured()


_lock = threading.Lock()
# (the environment's key, its runtime, the settings it was built from, when they were read: time.monotonic()).
_current: tuple[tuple[tuple[str, str], ...], Runtime, Settings, float] | None = None
_overrides: dict[str, Any] = {}
_seam_providers: list[SeamProvider] = []
# How long a runtime's settings are used before the secret keys are read again (with the farm, one call: the
# values' own cache, adapters.aws.CONFIG_MAX_AGE_S, is as long): a rotated link key reaches every warm container
# within about this time. Settings that did not change keep the runtime and its collaborators.
SETTINGS_MAX_AGE_S = 300.0


def install_seams(provider: SeamProvider) -> None:
    """Let a development tool replace production collaborators in the environments it recognises (idempotent)."""
    global _current  # noqa: PLW0603
    with _lock:
        if provider not in _seam_providers:
            _seam_providers.append(provider)
        _current = None


def current() -> Runtime:
    """The runtime for the present environment, built on first use and reused while the environment holds and its
    settings (secret keys included) read again every SETTINGS_MAX_AGE_S stay the same."""
    global _current  # noqa: PLW0603 - one runtime per container is the point
    environ = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}
    key = tuple(sorted(environ.items()))
    now = time.monotonic()
    with _lock:
        same = _current is not None and _current[0] == key
        if _current is not None and same and now - _current[3] < SETTINGS_MAX_AGE_S:
            return _current[1]
        try:
            settings = _load_settings()
        except UpstreamError as exc:
            if _current is None or not same:
                raise
            # Parameter Store did not answer this time: the settings read before serve until the next try.
            log.warning("reading the settings again failed, keeping those read before: %s", exc)
            _current = (key, _current[1], _current[2], now)
            return _current[1]
        if _current is not None and same and settings == _current[2]:
            _current = (key, _current[1], settings, now)
        else:
            _current = (key, Runtime(settings, environ), settings, now)
        return _current[1]


def override(**parts: Any) -> None:
    """Replace collaborators (tests, benchmarks): clock, invoker, chat, ingress_chat, farm, incidents, ..."""
    global _current  # noqa: PLW0603
    with _lock:
        _overrides.update(parts)
        _current = None


def reset() -> None:
    """Forget the runtime and every override (tests)."""
    global _current  # noqa: PLW0603
    with _lock:
        _overrides.clear()
        _current = None


def prepare_for_snapshot(services: Sequence[str]) -> None:
    """SnapStart, before the snapshot: build the AWS clients (and the direct calls on their endpoints) and load what
    a first request loads; no secret read."""
    from pydantic import BaseModel

    from gpufarm.adapters import aws
    from gpufarm.adapters import slack as _slack  # noqa: F401 - loaded into the snapshot, used on the first request
    from gpufarm.core.chat import modal as _modal  # noqa: F401 - the request form, loaded on its first opening
    from gpufarm.core.config.yaml_load import bounded_loader
    from gpufarm.core.governance import policy as _policy  # noqa: F401 - the farm's models and the request's
    from gpufarm.core.kernel import model

    settings = Settings()
    for service in services:
        aws.aws_client(service, settings)
    # After the restore, GetParameters and the hand-off go without their clients' pipeline (adapters/aws_lean.py),
    # on the endpoints, credentials and limits of the clients built here.
    aws.use_direct_calls(services, settings)
    # The farm's YAML loader: PyYAML's import (its resolver's patterns compiled) was most of a restored first
    # request's CPU. The loader holds no farm value; the farm itself is still read after the restore.
    bounded_loader()
    _parse_farm_before_snapshot(settings)
    # The validators a first request would otherwise build on first use (defer_build).
    for value in vars(model).values():
        if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == model.__name__:
            value.model_rebuild(force=True)


def _parse_farm_before_snapshot(settings: Settings) -> None:
    """The farm read and parsed into the snapshot (it is configuration, not a secret): after a restore the farm is
    read again with the secret keys, in the same call, and parsed again only if its text changed. The value read
    here is not kept in the parameter cache, which a restore empties anyway; a farm that cannot be read or parsed
    now is left to the first request, which reads it and says what is wrong."""
    from gpufarm.adapters import aws

    try:
        parsed_farm(aws.load_farm_text(settings))
    except GpufarmError as exc:
        log.info("the farm was not parsed before the snapshot: %s", type(exc).__name__)
    finally:
        aws.clear_config_cache()


def after_restore() -> None:
    """SnapStart, after a restore: forget cached configuration, the runtime and pooled connections; reseed random."""
    global _current  # noqa: PLW0603
    import random

    from gpufarm.adapters import aws

    aws.clear_config_cache()
    aws.forget_connections()
    random.seed()
    with _lock:
        _current = None


def _load_settings() -> Settings:
    from gpufarm.adapters.aws import load_settings

    return load_settings()


def describe(exc: Exception) -> str:
    """What to tell a Slack user about a failure, never a key or a traceback."""
    if isinstance(exc, ConfigurationError):
        # Before NotFound: a missing secret or parameter is also a NotFound, and its name is for operators only.
        return "gpufarm is not fully configured; the GPU operators have been told (see the function logs)"
    if isinstance(exc, ValidationFailed):
        return exc.message
    if isinstance(exc, (NotAllowed, NotFound, Conflict)):
        return str(exc)
    if isinstance(exc, UpstreamError):
        return f"gpufarm could not finish because a service failed ({exc}); try again in a minute"
    from gpufarm.core.config.farm import FarmConfigError

    if isinstance(exc, FarmConfigError):
        return "the farm configuration is invalid; the GPU operators must fix it (see the function logs)"
    return "something went wrong inside gpufarm; the GPU operators can find the details in the function logs"
