"""gpufarm: the lifecycle of a GPU in a shared farm, from Slack request to reclaim."""

__version__ = "0.1.0"
