"""Profiler traces on the lease: reading torch.profiler's Chrome traces, their figures, metrics and summary page.

Nothing here imports torch: the traces are read as JSON (gpufarm.profiling.reader), so the CLI and the capture
helper work in any environment and the Lambda layer carries only ijson for it.
"""
