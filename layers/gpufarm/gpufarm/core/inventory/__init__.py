"""What exists and where a lease fits: inventory sources merged into one ledger of nodes, and placement."""
