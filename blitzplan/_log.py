"""Logging: the library's loggers and the console handler the CLI installs.

The library only logs, through ``logging.getLogger(__name__)`` (every name under
``"blitzplan"``), and configures nothing at import. An application chooses where the records go;
the ``blitzplan`` command line does it with :func:`console_logging`, at the level of
``--log-level`` or else of the ``BLITZPLAN_LOG`` environment variable (default WARNING).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from blitzplan.errors import InvalidInputError

__all__ = ["LEVELS", "LEVEL_ENV", "ROOT_LOGGER", "console_logging", "log_level", "timed"]

ROOT_LOGGER = "blitzplan"
"""Every logger of the library is under this name."""

LEVEL_ENV = "BLITZPLAN_LOG"
"""The environment variable the command line reads its log level from."""

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_level(option: str | None) -> str:
    """The level to use: ``option`` when given, else ``$BLITZPLAN_LOG``, else WARNING."""
    if option is not None:
        source, value = "--log-level", option
    else:
        source, value = LEVEL_ENV, os.environ.get(LEVEL_ENV, "") or "WARNING"
    level = value.strip().upper()
    if level not in LEVELS:
        raise InvalidInputError(f"{source} must be one of {', '.join(LEVELS)}, got {value!r}")
    return level


@contextmanager
def console_logging(level: str) -> Iterator[logging.Handler]:
    """Send the library's records at ``level`` and above to stderr while the block runs, then
    put the ``blitzplan`` logger back as it was (a command run in-process leaves no handler)."""
    logger = logging.getLogger(ROOT_LOGGER)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    previous = logger.level
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


@contextmanager
def timed(logger: logging.Logger, what: str) -> Iterator[None]:
    """Log ``what`` at INFO when it starts and when it ends, with its wall time; a failure is
    logged with its exception type and message (and raised on)."""
    logger.info("%s: started", what)
    started = time.perf_counter()
    try:
        yield
    except Exception as exc:
        elapsed = time.perf_counter() - started
        logger.info("%s: failed after %.3f s (%s: %s)", what, elapsed, type(exc).__name__, exc)
        raise
    logger.info("%s: done in %.3f s", what, time.perf_counter() - started)
