"""GPU-hours: measured usage, accrual into incidents, budgets, the quota view and the ledger's gauges."""
