"""The one writer per incident: the executor of queued incident commands and the record making them idempotent."""
