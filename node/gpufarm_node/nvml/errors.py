"""The NVML source's error, in a module of its own: the source may be compiled (docs/nvml.md §10), and a compiled
module's classes cannot derive from RuntimeError."""


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this host: no library, no driver, or a driver/library mismatch."""
