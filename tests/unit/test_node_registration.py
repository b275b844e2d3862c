"""Registration tags: appended when missing, replaced only when stale, allocation tags never touched."""

from __future__ import annotations

from typing import Any

import pytest
from datadog_api_client.exceptions import ApiException

from gpufarm_node.datadog import DatadogConfigError, target_from_env
from gpufarm_node.registration import HostRegistrar, merge_registration

WANTED = ["gpufarm:managed", "gpu_model:h100", "gpu_count:8", "environment:aws-cloud", "cluster:c1"]


class FakeTagsApi:
    """The user source of one host, as Datadog's v1 tags API keeps it."""

    def __init__(self, tags: list[str] | None = None, *, missing: bool = False) -> None:
        self.tags = list(tags or [])
        self.missing = missing
        self.calls: list[str] = []
        self.fail_with: Exception | None = None
        # Simulates the allocator tagging the host between our GET and PUT.
        self.on_get: list[str] = []

    def get_host_tags(self, *, host_name: str, source: str) -> dict[str, Any]:
        self.calls.append(f"GET {source}")
        if self.fail_with:
            raise self.fail_with
        if self.missing:
            raise ApiException(status=404, reason="Not Found")
        answer = {"host": host_name, "tags": list(self.tags)}
        self.tags += [t for t in self.on_get if t not in self.tags]
        self.on_get = []
        return answer

    def create_host_tags(self, *, host_name: str, body: Any, source: str) -> dict[str, Any]:
        self.calls.append(f"POST {source} {' '.join(body.tags)}")
        self.missing = False
        self.tags += [t for t in body.tags if t not in self.tags]
        return {"host": host_name, "tags": list(body.tags)}

    def update_host_tags(self, *, host_name: str, body: Any, source: str) -> dict[str, Any]:
        self.calls.append(f"PUT {source}")
        self.tags = list(body.tags)
        return {"host": host_name, "tags": list(body.tags)}


def _registrar(api: FakeTagsApi, now: list[float] | None = None) -> HostRegistrar:
    clock = now or [0.0]
    return HostRegistrar(api, "gpu-node-01", "aws-cloud", "c1", interval=300, retry_after=60, clock=lambda: clock[0])


def test_merge_appends_missing_and_replaces_only_stale_registration_values() -> None:
    assert merge_registration(["team:nlp"], WANTED) == (WANTED, [])
    current = ["gpufarm:managed", "gpu_count:7", "ir:ir-5", "project:llm", "rack:r1", *WANTED[1:2], *WANTED[3:]]
    append, replace = merge_registration(current, WANTED)
    assert append == [] and "gpu_count:7" not in replace and "gpu_count:8" in replace
    assert {"ir:ir-5", "project:llm", "rack:r1"} <= set(replace)
    assert merge_registration(WANTED, WANTED) == ([], [])


def test_a_new_host_is_registered_with_one_post() -> None:
    api = FakeTagsApi(missing=True)
    registrar = _registrar(api)
    assert registrar.refresh("H100", 8) is True
    assert api.calls == ["GET user", f"POST user {' '.join(WANTED)}"]
    assert registrar.registered and registrar.host_ir() is None


def test_an_already_registered_host_only_reads_and_learns_its_ir() -> None:
    api = FakeTagsApi([*WANTED, "ir:ir-42", "project:llm"])
    registrar = _registrar(api)
    assert registrar.refresh("H100", 8)
    assert api.calls == ["GET user"] and registrar.host_ir() == "ir-42"


def test_a_stale_value_is_replaced_without_losing_an_allocation_written_meanwhile() -> None:
    api = FakeTagsApi(["gpufarm:managed", "gpu_model:h100", "gpu_count:7", "environment:aws-cloud", "cluster:c1"])
    api.on_get = ["ir:ir-9", "team:vision"]  # the allocator tags the host right after our first read
    registrar = _registrar(api)
    assert registrar.refresh("H100", 8)
    assert api.calls == ["GET user", "GET user", "PUT user"]
    assert set(api.tags) == {*WANTED, "ir:ir-9", "team:vision"}
    assert registrar.host_ir() == "ir-9"


def test_a_host_shared_by_two_irs_has_no_single_host_ir() -> None:
    registrar = _registrar(FakeTagsApi([*WANTED, "ir:ir-1", "ir:ir-2"]))
    registrar.refresh("H100", 8)
    assert registrar.host_ir() is None


def test_a_shared_host_with_one_lease_names_no_lease_for_the_whole_host() -> None:
    unit = "mig-0e6a0b7a-3d2d-5c8c-9a3f-7c1b2d4e5f60"
    registrar = _registrar(FakeTagsApi([*WANTED, "ir:ir-2", f"gpu_assign:ir-2/{unit}"]))
    registrar.refresh("H100", 8)
    assert registrar.host_ir() is None


def test_failures_are_retried_sooner_and_successes_wait_the_interval() -> None:
    now = [0.0]
    api = FakeTagsApi(WANTED)
    api.fail_with = ApiException(status=503, reason="down")
    registrar = _registrar(api, now)
    assert registrar.due() and registrar.refresh("H100", 8) is False
    now[0] = 59
    assert not registrar.due()
    now[0] = 60
    api.fail_with = None
    assert registrar.due() and registrar.refresh("H100", 8) is True
    now[0] = 359
    assert not registrar.due()
    now[0] = 360
    assert registrar.due()


def test_target_from_env_prefers_the_explicit_host_and_reads_key_files(tmp_path: Any) -> None:
    key = tmp_path / "api"
    key.write_text("file-key\n")
    target = target_from_env({"GPUFARM_DATADOG_HOST": "http://127.0.0.1:9/", "DD_API_KEY_FILE": str(key)})
    assert (target.base_url, target.api_key, target.app_key) == ("http://127.0.0.1:9", "file-key", None)
    assert "file-key" not in repr(target)
    assert target_from_env({"DD_SITE": "datadoghq.eu", "DD_API_KEY": "k"}).base_url == "https://api.datadoghq.eu"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "DD_API_KEY"),
        ({"DD_API_KEY": "k", "GPUFARM_DATADOG_HOST": "ftp://x"}, "http"),
        ({"DD_API_KEY_FILE": "/nonexistent/key"}, "cannot be read"),
    ],
)
def test_target_from_env_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(DatadogConfigError, match=message):
        target_from_env(env)
