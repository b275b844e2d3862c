"""Sandbox module: webhooks (being built)."""

from __future__ import annotations

from gpufarm.sandbox.base import BaseModule


class WebhooksModule(BaseModule):
    """webhooks API of the sandbox."""

    name = "webhooks"
