"""Client-side helpers shared by the contract tests: typed client calls and plain HTTP against the sandbox."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from datadog_api_client.exceptions import ApiException
from datadog_api_client.model_utils import OpenApiModel
from werkzeug.wrappers import Request, Response

from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.setup.plan import INCIDENT_TYPE_DESCRIPTION, desired_fields
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY

KEYS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}
# The farm configuration's choices the gateway tests define gpufarm's fields with.
VALID_VALUES = {"team": ["nlp", "vision"], "gpu_model": ["H100", "A100"], "environment": ["onprem-hpc", "cloud"]}

# What the command-line tests run `gpufarm datadog apply` with: webhook URLs nothing listens on (they read the plan).
APPLY_ENV = {
    "GPUFARM_INCIDENT_WEBHOOK_URL": "http://127.0.0.1:9/fn/incident_webhook/",
    "GPUFARM_IDLE_WEBHOOK_URL": "http://127.0.0.1:9/fn/idle_alert/",
}


def farm_file(directory: Path, text: str) -> Path:
    """The farm configuration `text` written as farm.yaml in `directory` (the file --farm-config names)."""
    path = directory / "farm.yaml"
    path.write_text(text)
    return path


def define_gpufarm_type(admin: DatadogAdmin, name: str, valid_values: Mapping[str, list[str]]) -> str:
    """gpufarm's incident type `name` with its fields, made as `gpufarm datadog apply` makes them; its id.

    The sandbox, like Datadog, refuses fields no definition names, so gateway tests need these first.
    """
    made = admin.create_incident_type(name, INCIDENT_TYPE_DESCRIPTION)
    for _, attributes in desired_fields(dict(valid_values)):
        assert attributes is not None
        admin.create_field_definition(attributes, str(made["id"]))
    return str(made["id"])


def unparsed_paths(node: Any, path: str = "$") -> list[str]:
    """Every place in a deserialized answer the client could not type (it marks them `_unparsed`)."""
    found: list[str] = []
    if isinstance(node, OpenApiModel):
        if getattr(node, "_unparsed", False):
            found.append(path)
        for key, value in node._data_store.items():
            found += unparsed_paths(value, f"{path}.{key}")
    elif isinstance(node, (list, tuple)):
        for index, item in enumerate(node):
            found += unparsed_paths(item, f"{path}[{index}]")
    elif isinstance(node, dict):
        for key, value in node.items():
            found += unparsed_paths(value, f"{path}.{key}")
    return found


def call(api: Any, operation: str, **kwargs: Any) -> tuple[int, Any, Any]:
    """One client operation: (status, raw JSON answer, model deserialized by the client with type checks).

    Error answers come back as (status, decoded body, None), the body as the client decoded it: the client
    raises ApiException for every status outside 2xx, so only successful answers are deserialized here.
    """
    cfg = api.api_client.configuration
    cfg.preload_content = False
    try:
        answer = getattr(api, operation)(**kwargs)
    except ApiException as exc:
        return int(exc.status), exc.body or None, None
    finally:
        cfg.preload_content = True
    raw = json.loads(answer.data) if answer.data else None
    model = None
    response_type = getattr(api, f"_{operation}_endpoint").settings["response_type"]
    if raw is not None and response_type:
        model = api.api_client.deserialize(answer.data.decode(), response_type, True)
        assert unparsed_paths(model) == []
    return answer.status, raw, model


def http(
    url: str,
    method: str = "GET",
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    *,
    keys: bool = True,
    timeout: float = 10,
) -> tuple[int, Any]:
    """Plain HTTP for what the client refuses to send (malformed bodies) and for /_sandbox endpoints.

    A bytes body goes as is, a str as UTF-8, anything else as JSON. `keys` adds the default Datadog keys;
    `headers` go on top of them, so a test can replace or blank one. The answer is (status, decoded JSON or None).
    """
    if body is None or isinstance(body, bytes):
        data = body
    else:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    all_headers = {"Content-Type": "application/json", **(KEYS if keys else {}), **(headers or {})}
    request = urllib.request.Request(url, data=data, headers=all_headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            text = answer.read()
            return answer.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        text = exc.read()
        return exc.code, json.loads(text) if text else None


class Delivery(NamedTuple):
    """One call a webhook target received: its path, headers and decoded JSON body."""

    path: str
    headers: dict[str, str]
    body: Any


class Receiver:
    """A webhook target (a WSGI app, served by ServerThread) that records every call Datadog (the sandbox) makes."""

    def __init__(self) -> None:
        self.calls: list[Delivery] = []
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        with self._lock:
            self.calls.append(Delivery(request.path, dict(request.headers), json.loads(request.get_data() or b"null")))
        return Response("{}", status=200, content_type="application/json")(environ, start_response)

    @property
    def bodies(self) -> list[Any]:
        """The decoded bodies, in the order they arrived."""
        return [call.body for call in self.calls]

    @property
    def headers(self) -> list[dict[str, str]]:
        """The headers of each call, in the order they arrived."""
        return [call.headers for call in self.calls]
