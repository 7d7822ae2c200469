"""structlog set-up: JSON lines when not on a terminal, a console renderer on one."""

from __future__ import annotations

import logging
import sys

import structlog

# Libraries that log through the standard library with handlers of their own (hypercorn's "Running on …", the MCP
# SDK's rich console lines): routed through the same renderer, so a terminal shows one style.
FOREIGN_LOGGERS = ("hypercorn.error", "mcp")


def configure(level: str = "info", fmt: str = "auto") -> None:
    renderer: structlog.typing.Processor
    if fmt == "console" or (fmt == "auto" and sys.stderr.isatty()):
        renderer = structlog.dev.ConsoleRenderer()
    else:
        renderer = structlog.processors.JSONRenderer()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processor=renderer,
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
                           structlog.processors.TimeStamper(fmt="iso", utc=True)]))
    for name in FOREIGN_LOGGERS:
        foreign = logging.getLogger(name)
        foreign.handlers = [handler]
        foreign.propagate = False
        foreign.setLevel(max(logging.getLevelName(level.upper()), logging.INFO))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # one write per line: a line logged from a worker thread is never split by another writer's output
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)  # the wrapper class configured above
    return logger


def foreign(name: str) -> logging.Logger:
    """A library's standard-library logger, rendered as ours (`configure` set its handler): hypercorn's error log
    is given this, or it makes a handler and a format of its own."""
    return logging.getLogger(name)
