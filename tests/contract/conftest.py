"""Contract-test fixtures: the real datadog-api-client aimed at the reset sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from datadog_api_client import ApiClient
from helpers import Receiver

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
