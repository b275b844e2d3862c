"""A local stand-in for the Datadog and Slack APIs gpufarm uses, with inspection, a clock and faults."""
