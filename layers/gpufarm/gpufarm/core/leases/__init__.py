"""The lease lifecycle: request, decision, allocation, reclaim, release, extension, queries, terms, notices."""
