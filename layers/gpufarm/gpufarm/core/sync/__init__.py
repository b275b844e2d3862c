"""The scheduled sync: expiries and reminders as commands, drift repair per pool, gauges."""
