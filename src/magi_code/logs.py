"""Log level and format for every magi-code process, from the launch environment.

``MC_LOG_LEVEL`` (``debug``, ``info``, ``warning``, ``error``) sets the level of the
``magi_code`` loggers: the daemon defaults to ``info`` (one line per lifecycle event and
per turn end), the stdio service and the CLI to ``warning``. Third-party loggers stay at
``warning`` whatever the setting (httpx logs URLs at ``info``). ``MC_LOG_FORMAT=json``
writes one JSON object per line (``ts``, ``level``, ``logger``, ``pid``, ``message`` and
the record's structured ``fields``) instead of text.

Log lines carry event names, fixed labels, codes, counts and hashed IDs: never
environments, request data, provider text, secrets or paths of request data.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any, Final

import orjson

LEVEL_ENV: Final = "MC_LOG_LEVEL"
FORMAT_ENV: Final = "MC_LOG_FORMAT"
_STDERR_MARK: Final = "_magi_code_stderr"
LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def level(env: Mapping[str, str], default: int) -> int:
    """``MC_LOG_LEVEL`` as a logging level (unknown values keep ``default``)."""
    return LEVELS.get(env.get(LEVEL_ENV, "").strip().lower(), default)


def wants_json(env: Mapping[str, str]) -> bool:
    return env.get(FORMAT_ENV, "").strip().lower() == "json"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; ``extra={"fields": {...}}`` adds structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": os.getpid(),
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            document["fields"] = dict(fields)
        return orjson.dumps(document, default=str).decode()


def formatter(env: Mapping[str, str], text_format: str) -> logging.Formatter:
    return JsonFormatter() if wants_json(env) else logging.Formatter(text_format)


def file_formatter(env: Mapping[str, str]) -> logging.Formatter:
    """``daemon.log``'s lines: time, this process's pid, level, logger and message."""
    return formatter(env, f"%(asctime)s [{os.getpid()}] %(levelname)s %(name)s: %(message)s")


class LineFormatter(logging.Formatter):
    """One line per record, an exception shown by its type only: a traceback's frames and
    an exception's text name files (stderr carries no host paths)."""

    def format(self, record: logging.LogRecord) -> str:
        # Left out of this line only: another handler's formatter still finds them.
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            line = super().format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved
        if record.exc_info and record.exc_info[0] is not None:
            line += f" ({record.exc_info[0].__name__})"
        return line.replace("\n", " ")


def configure_stderr(env: Mapping[str, str], default: int = logging.WARNING) -> None:
    """The stdio service's and the CLI's logging: one stderr handler, ``magi-code: ...``."""
    root = logging.getLogger()
    if any(getattr(h, _STDERR_MARK, False) for h in root.handlers):
        return
    handler = logging.StreamHandler()
    setattr(handler, _STDERR_MARK, True)
    text = "magi-code: %(message)s"
    handler.setFormatter(JsonFormatter() if wants_json(env) else LineFormatter(text))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("magi_code").setLevel(level(env, default))
