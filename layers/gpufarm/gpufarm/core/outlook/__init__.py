"""The demand and capacity outlook: unmet demand per pool and model over a period, free capacity weeks ahead."""
