"""Function telemetry: JSON log lines with correlation keys (Powertools Logger), set up once per Lambda container.

In Lambda every function logs through one Powertools Logger: JSON on stdout, the service name from
POWERTOOLS_SERVICE_NAME, the level from the function's LoggingConfig (AWS_LAMBDA_LOG_LEVEL; POWERTOOLS_LOG_LEVEL
where Lambda's log controls are absent, as under `sam local invoke`), and the Lambda context (function, request id,
cold start) on every line. The gpufarm package's own loggers (`logging.getLogger(__name__)` in every module) are
routed to the same handler, so the allocation, reclaim and sync lines reach CloudWatch at INFO; third-party loggers
stay on the runtime's root handler, which LoggingConfig makes JSON too. Handlers add what they learn about the
invocation (IR, Slack user, request id, incident id, pool) with `correlate`; those keys are dropped at the start of
the next invocation.

Outside Lambda (tests, the local function host, the operator CLI) logging stays as the process set it up and
`correlate` does nothing. Everywhere, `instrument` also opens the invocation's time budget from the context
(gpufarm.adapters.time_budget), so retries give up before the function's Timeout on the local host as in Lambda.
Powertools is imported only in Lambda, at import of the entry point, so a SnapStart snapshot already holds it.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpufarm.adapters import time_budget
from gpufarm.config import running_in_lambda
from gpufarm.core.kernel.ir import format_ir

if TYPE_CHECKING:
    from aws_lambda_powertools import Logger

PACKAGE = "gpufarm"
SERVICE_ENV = "POWERTOOLS_SERVICE_NAME"
DEFAULT_SERVICE = "gpufarm"
# What `correlate` may add; removed again when the next invocation starts.
CORRELATION_KEYS = ("ir", "slack_user", "request_id", "incident_id", "pool")

Handler = Callable[[Any, Any], Any]

_logger: Logger | None = None


def setup() -> Logger | None:
    """The container's Powertools Logger, built on the first call in Lambda; None elsewhere."""
    global _logger  # noqa: PLW0603 - one logger per container is the point
    if _logger is None and running_in_lambda():
        from aws_lambda_powertools import Logger
        from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

        logger = Logger(service=os.environ.get(SERVICE_ENV) or DEFAULT_SERVICE)
        # The Powertools logger is the stdlib logger named after the service. Give the gpufarm package logger (the
        # parent of every module's logger) the same handler and level; when the service is called "gpufarm" they
        # are one logger already and the copy skips it.
        logging.getLogger(PACKAGE)
        copy_config_to_registered_loggers(source_logger=logger, include={PACKAGE})
        logger.append_keys(name="%(name)s")  # which module wrote the line
        _logger = logger
    return _logger


def instrument(handle: Handler) -> Handler:
    """The Lambda entry point for `handle`: its time budget, the context on every log line, fresh correlation keys."""
    logger = setup()
    logged = handle if logger is None else logger.inject_lambda_context(handle)

    @functools.wraps(handle)
    def handler(event: Any, context: Any) -> Any:
        with time_budget.invocation(time_budget.remaining_s(context)):
            if logger is None:
                return handle(event, context)
            logger.remove_keys(list(CORRELATION_KEYS))
            # Lambda always passes a context; a direct call without one (a smoke test) just runs the handler.
            return handle(event, context) if context is None else logged(event, context)

    return handler


def correlate(
    *,
    ir: int | None = None,
    slack_user: str | None = None,
    request_id: str | None = None,
    incident_id: str | None = None,
    pool: str | None = None,
) -> None:
    """Add what this invocation is about to its later log lines (arguments left None are not touched)."""
    if _logger is None:
        return
    keys: dict[str, object] = {
        "ir": format_ir(ir) if ir is not None else None,
        "slack_user": slack_user,
        "request_id": request_id,
        "incident_id": incident_id,
        "pool": pool,
    }
    _logger.append_keys(**{k: v for k, v in keys.items() if v is not None})
