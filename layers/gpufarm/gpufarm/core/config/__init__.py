"""The farm YAML: pools, GPU models, teams and quotas, idle, inventory, accounting, digest and keep settings."""
