"""NVML -> NodeSnapshot: the only package of the agent that imports pynvml (docs/nvml.md §7, docs/design.md
"House style"). `source.NvmlSource` reads every GPU; `device`, `fields` and `xid` hold what it keeps per GPU, how it
reads pynvml's structures, and the XID event watcher."""
