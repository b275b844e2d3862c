"""One invocation's view of the farm, and the LeaseContext every use case reads, writes and tells through."""
