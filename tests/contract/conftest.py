"""Contract-test fixtures: the real datadog-api-client aimed at the reset sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from datadog_api_client import ApiClient
from helpers import VALID_VALUES, Receiver, define_gpufarm_type

from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.config import Settings
from gpufarm_sandbox.emulator.server import ServerThread


@pytest.fixture
def client(dd_configuration: Any) -> Iterator[ApiClient]:
    """The real client aimed at a freshly reset sandbox, incident operations enabled, return type checks on."""
    with ApiClient(dd_configuration) as api_client:
        yield api_client


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    """A recording webhook receiver on loopback and its base URL."""
    app = Receiver()
    with ServerThread(app) as server:
        yield app, server.url


@pytest.fixture
def settings(dd_env: str) -> Settings:
    """Settings from the environment dd_env points at the sandbox (keys included), one fast retry."""
    return Settings(max_retries=1, http_timeout=5)


@pytest.fixture
def type_id(settings: Settings) -> str:
    """gpufarm's incident type with its fields (VALID_VALUES), made as `gpufarm datadog apply` makes them; its id."""
    admin = DatadogAdmin(settings)
    try:
        return define_gpufarm_type(admin, settings.incident_type, VALID_VALUES)
    finally:
        admin.close()
