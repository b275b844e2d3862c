"""gpufarm-node: the node agent that reads NVML per GPU, MIG slice and process, attributes usage to IRs and
pushes it to Datadog.

Layering: only the `nvml` package (and the test double `fake_nvml`) import pynvml; everything else works on the
`NodeSnapshot` it produces. The package imports no pydantic, slack_sdk, boto3 or Lambda tooling, so a GPU node
needs only nvidia-ml-py, datadog-api-client, click and pyyaml.
"""

__version__ = "0.1.0"
