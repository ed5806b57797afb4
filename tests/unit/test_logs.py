"""The stderr log handler writes one line per record and no traceback: frames and an
exception's text name files, and stderr carries no host paths."""

from __future__ import annotations

import io
import logging

from magi_code.logs import LineFormatter


def test_a_logged_exception_is_one_line_with_its_type_and_no_path() -> None:
    logger = logging.getLogger("magi_code.test_logs")
    logger.propagate = False
    stderr, daemon_log = io.StringIO(), io.StringIO()
    for stream, formatter in (
        (stderr, LineFormatter("magi-code: %(message)s")),
        (daemon_log, logging.Formatter("%(message)s")),
    ):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    try:
        try:
            open("/nonexistent-dir/settings.json")  # noqa: SIM115 - the exception is the point
        except OSError:
            logger.exception("request handler failed (method=%s)", "config.get")
        logger.warning("a stack", stack_info=True)
    finally:
        logger.handlers.clear()
        logger.propagate = True
    assert stderr.getvalue().splitlines() == [
        "magi-code: request handler failed (method=config.get) (FileNotFoundError)",
        "magi-code: a stack",
    ]
    # Another handler of the same record still gets the whole traceback.
    assert "Traceback" in daemon_log.getvalue()
    assert "/nonexistent-dir/settings.json" in daemon_log.getvalue()
