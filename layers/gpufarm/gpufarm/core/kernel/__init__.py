"""Shared vocabulary: errors, IRs, lifecycle, incident fields and history, leases, hosts and tags, units, ports."""
