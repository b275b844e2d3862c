"""Adapters: the core's ports implemented over datadog-api-client, slack-sdk and boto3.

Each adapter module imports its client library itself, so importing this package stays cheap
(the Slack ingress imports only adapters.slack; docs/design.md, rule 6).
"""
