"""Reports: GPU-hours held, busy, idle and unmeasured per team, project, lease or environment, over a period.

`gpufarm report` (gpufarm.cli.report) and `/gpu report` (gpufarm.reporting.slack) build the same report from
the incidents (their accrued GPU-hours and history: docs/design.md, "The ledger") and, for the HTML's charts, the
ledger gauges over time. Nothing here is imported by the Lambda entry points except the Slack path, which needs
neither plotly nor the command line.
"""
