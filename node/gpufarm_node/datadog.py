"""The agent's Datadog connection: where (GPUFARM_DATADOG_HOST or DD_SITE), which keys, bounded retries and timeouts.

Kept apart from `gpufarm.config` so a node needs no pydantic: it reads the same variable names.
Keys come from DD_API_KEY / DD_APP_KEY, or from the files named by DD_API_KEY_FILE / DD_APP_KEY_FILE (systemd
credentials, Kubernetes secret volumes); they live only inside the client's configuration, never in logs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class DatadogConfigError(ValueError):
    """The Datadog settings are missing or malformed; the message says which variable to set."""


@dataclass(frozen=True)
class DatadogTarget:
    """Base URL and keys; keys are excluded from repr so they never reach a log line."""

    base_url: str
    api_key: str = field(repr=False)
    app_key: str | None = field(default=None, repr=False)


def target_from_env(env: Mapping[str, str] | None = None, *, need_api_key: bool = True) -> DatadogTarget:
    """Read GPUFARM_DATADOG_HOST (else https://api.<DD_SITE>), DD_API_KEY[_FILE] and DD_APP_KEY[_FILE]."""
    env = os.environ if env is None else env
    host = (env.get("GPUFARM_DATADOG_HOST") or "").strip()
    site = (env.get("GPUFARM_DATADOG_SITE") or env.get("DD_SITE") or "datadoghq.com").strip()
    base_url = host.rstrip("/") if host else f"https://api.{site}"
    if not base_url.startswith(("http://", "https://")) or " " in base_url:
        raise DatadogConfigError("GPUFARM_DATADOG_HOST must be an http(s) URL, e.g. https://api.datadoghq.eu")
    api_key = _secret(env, "DD_API_KEY") or _secret(env, "GPUFARM_DATADOG_API_KEY")
    app_key = _secret(env, "DD_APP_KEY") or _secret(env, "GPUFARM_DATADOG_APP_KEY")
    if need_api_key and not api_key:
        raise DatadogConfigError("set DD_API_KEY (or DD_API_KEY_FILE) so the agent can send metrics")
    return DatadogTarget(base_url, api_key or "", app_key)


def _secret(env: Mapping[str, str], name: str) -> str | None:
    value = (env.get(name) or "").strip()
    if value:
        return value
    path = (env.get(f"{name}_FILE") or "").strip()
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as exc:
        raise DatadogConfigError(f"{name}_FILE names {path}, which cannot be read ({exc.strerror})") from exc


def api_client(
    target: DatadogTarget,
    *,
    connect_timeout: float = 5.0,
    read_timeout: float = 15.0,
    max_retries: int = 2,
) -> Any:
    """A datadog-api-client ApiClient for `target`, with bounded retries and timeouts.

    Input type checking is off: the agent hands the client plain JSON-shaped bodies it has built and checked
    itself, sparing a model object per value.
    """
    from datadog_api_client import ApiClient, Configuration

    # The constructor is untyped; the Any alias keeps mypy strict elsewhere.
    configuration: Any = Configuration
    cfg = configuration(
        host=target.base_url,
        request_timeout=(connect_timeout, read_timeout),
        enable_retry=max_retries > 0,
        max_retries=max(max_retries, 0),
        retry_backoff_factor=2,  # the client refuses factors below 2
        check_input_type=False,
    )
    cfg.api_key["apiKeyAuth"] = target.api_key
    if target.app_key:
        cfg.api_key["appKeyAuth"] = target.app_key
    return ApiClient(cfg)


def tags_api(client: Any) -> Any:
    """TagsApi (v1) on a client."""
    from datadog_api_client.v1.api.tags_api import TagsApi

    api: Any = TagsApi  # untyped constructor
    return api(client)
