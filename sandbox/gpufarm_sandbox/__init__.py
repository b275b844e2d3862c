"""gpufarm-sandbox: the development tools around the gpufarm runtime.

- `emulator/`: the local Datadog + Slack API sandbox (`gpufarm sandbox`);
- `localhost/`: the local function host (`gpufarm local`), which injects the local seams (the sandbox clock,
  in-process invokes and queues) into the runtime;
- `simfarm`: simulated GPU nodes running the real agent over the fake NVML;
- `demo/`: the scripted lifecycle (`gpufarm demo`).

None of it ships in the Lambda layer or on a GPU node.
"""

__version__ = "0.1.0"
