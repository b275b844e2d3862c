"""botocore service models cut down to the operations gpufarm calls, loaded ahead of botocore's own.

botocore builds a client from its service's whole model: SSM's holds 154 operations and 1,360 shapes (~1 MB of
JSON), Lambda's 91 and 612. Parsing them and making a method for every operation is most of what creating those
two clients costs: about 60 ms for SSM and 25 ms for Lambda of the Slack ingress's cold start (docs/design.md,
"Slack's 3 seconds"), for one operation each. The files in botocore-models/ hold those operations only, each with
every shape it reaches, copied verbatim from botocore's model of the same API version (metadata included);
adapters/aws.py puts that folder first on its session's model search path, so botocore reads these and still
reads its own endpoint rules.

botocore also parses its endpoint data (endpoints.json, 1.2 MB: every partition, every service, every region)
when the session makes its first client, which was most of what that first client cost (~30-45 ms). The folder
holds that file too, cut to the services this session makes clients for (ENDPOINT_SERVICES) with every partition
and region of theirs kept verbatim; the endpoint rules each client follows are botocore's own, unchanged.

A client from that session has only these operations: gpufarm calling another means adding it to OPERATIONS and
regenerating the files (`python -m gpufarm.adapters.botocore_models`); tests/unit/test_botocore_models.py fails
while the files differ from what the installed botocore would give.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Data, not a package: botocore's layout, <service>/<API version>/service-2.json.
MODELS = Path(__file__).resolve().parent / "botocore-models"
# service -> (API version, the operations gpufarm calls on it).
OPERATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ssm": ("2014-11-06", ("GetParameters",)),
    "lambda": ("2015-03-31", ("Invoke",)),
}


# The services adapters/aws.py's session makes clients for (aws_client and its _LazyClient users): their entries of
# botocore's endpoints.json are kept, every other service's left out. A service missing here would still resolve
# its endpoint from its own rules, but tests/unit/test_botocore_models.py fails until it is added.
ENDPOINT_SERVICES = ("lambda", "s3", "secretsmanager", "sqs", "ssm")


def trimmed_endpoints() -> dict[str, Any]:
    """The installed botocore's endpoints.json with only ENDPOINT_SERVICES in each partition."""
    import botocore.loaders

    full: dict[str, Any] = botocore.loaders.create_loader().load_data("endpoints")
    partitions = [
        {**partition, "services": {k: v for k, v in partition["services"].items() if k in ENDPOINT_SERVICES}}
        for partition in full["partitions"]
    ]
    return {**full, "partitions": partitions}


def trimmed(service: str) -> dict[str, Any]:
    """The installed botocore's model of `service`, reduced to OPERATIONS[service] and the shapes they reach."""
    import botocore.loaders

    version, operations = OPERATIONS[service]
    loader = botocore.loaders.create_loader()
    full: dict[str, Any] = loader.load_service_model(service, "service-2", api_version=version)
    shapes: dict[str, Any] = full["shapes"]
    keep: set[str] = set()

    def reach(name: str) -> None:
        if name in keep:
            return
        keep.add(name)
        shape = shapes[name]
        for key in ("member", "key", "value"):
            if key in shape:
                reach(shape[key]["shape"])
        for member in shape.get("members", {}).values():
            reach(member["shape"])

    for name in operations:
        operation = full["operations"][name]
        for key in ("input", "output"):
            if key in operation:
                reach(operation[key]["shape"])
        for error in operation.get("errors", []):
            reach(error["shape"])
    return {
        "version": full["version"],
        "metadata": full["metadata"],
        "operations": {name: full["operations"][name] for name in operations},
        "shapes": {name: shapes[name] for name in sorted(keep)},
    }


def path(service: str) -> Path:
    """Where the cut-down model of `service` lives."""
    return MODELS / service / OPERATIONS[service][0] / "service-2.json"


ENDPOINTS = MODELS / "endpoints.json"


def write() -> None:
    """Regenerate every file from the installed botocore."""
    for service in OPERATIONS:
        target = path(service)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(trimmed(service), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    # Compact: botocore parses it on every cold start.
    ENDPOINTS.write_text(
        json.dumps(trimmed_endpoints(), separators=(",", ":"), sort_keys=True) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    write()
