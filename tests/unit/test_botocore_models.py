"""The cut-down botocore models (gpufarm.adapters.botocore_models) match the installed botocore and serve the calls."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufarm.adapters import aws, botocore_models
from gpufarm.config import Settings

AWS_ADAPTER = Path(aws.__file__).read_text(encoding="utf-8")


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    yield


@pytest.mark.parametrize("service", sorted(botocore_models.OPERATIONS))
def test_each_file_is_what_the_installed_botocore_gives(service: str) -> None:
    on_disk = json.loads(botocore_models.path(service).read_text(encoding="utf-8"))
    assert on_disk == botocore_models.trimmed(service), "regenerate: python -m gpufarm.adapters.botocore_models"


@pytest.mark.parametrize("service", sorted(botocore_models.OPERATIONS))
def test_the_session_builds_clients_with_exactly_those_operations(service: str) -> None:
    client = aws.aws_client(service, Settings())
    assert client.meta.service_model.operation_names == list(botocore_models.OPERATIONS[service][1])
    # Endpoint rules still come from botocore's own data.
    assert client.meta.region_name == "us-east-1"


def test_every_operation_the_adapter_calls_is_in_a_model() -> None:
    """adapters/aws.py calls `.get_parameters(` on SSM and `.invoke(` on Lambda; nothing else of either."""
    ssm_calls = set(re.findall(r"\bssm\.(\w+)\(", AWS_ADAPTER))
    lambda_calls = set(re.findall(r"self\._lambda\.get\(\)\.(\w+)\(", AWS_ADAPTER))
    snake = {
        service: {re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() for name in operations}
        for service, (_, operations) in botocore_models.OPERATIONS.items()
    }
    assert ssm_calls <= snake["ssm"], ssm_calls
    assert lambda_calls <= snake["lambda"], lambda_calls
    assert ssm_calls and lambda_calls


def test_the_endpoint_data_is_what_the_installed_botocore_gives() -> None:
    on_disk = json.loads(botocore_models.ENDPOINTS.read_text(encoding="utf-8"))
    assert on_disk == botocore_models.trimmed_endpoints(), "regenerate: python -m gpufarm.adapters.botocore_models"


def test_every_service_the_session_makes_a_client_for_keeps_its_endpoint_data() -> None:
    adapters = Path(aws.__file__).parent
    made = set()
    for source in adapters.glob("*.py"):
        text = source.read_text(encoding="utf-8")
        made |= set(re.findall(r"_LazyClient\(\"(\w+)\"", text)) | set(re.findall(r"aws_client\(\"(\w+)\"", text))
    assert made, "no client found: the pattern above no longer matches the adapters"
    assert made <= set(botocore_models.ENDPOINT_SERVICES), made - set(botocore_models.ENDPOINT_SERVICES)


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1", "ap-southeast-2", "us-gov-west-1", "cn-north-1"])
def test_clients_reach_the_endpoints_a_plain_session_reaches(region: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import botocore.session

    monkeypatch.setenv("AWS_DEFAULT_REGION", region)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    aws.forget_clients()
    try:
        for service in botocore_models.ENDPOINT_SERVICES:
            ours = aws.aws_client(service, Settings())
            plain = botocore.session.get_session().create_client(service, region_name=region)
            assert ours.meta.endpoint_url == plain.meta.endpoint_url, service
            assert ours.meta.region_name == plain.meta.region_name == region
            assert ours.meta.partition == plain.meta.partition, service
    finally:
        aws.forget_clients()
