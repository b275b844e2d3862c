"""Datadog setup for gpufarm: `gpufarm datadog apply` (incident fields, webhooks, secret, notification rules)."""
