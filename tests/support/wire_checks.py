"""What every process test checks on the live stream of a v1 service.

``ServiceProcess`` feeds this with everything it writes to the service and every line it
reads back. Each line is checked twice: by the reference consumer
(:class:`magi_code.client.v1stream.V1StreamValidator`: framing, bounds, correlation,
per-turn ordering, terminals) and against the exact generated JSON Schemas
(``wire_schema.check_record``). A failure fails the test with the record and the reason
or schema path.
"""

from __future__ import annotations

from typing import Any

from magi_code.client.v1stream import StreamViolation, V1StreamValidator
from tests.support import wire_schema


class LiveChecks:
    def __init__(self) -> None:
        self.stream = V1StreamValidator()

    def sent(self, data: bytes) -> None:
        self.stream.sent_bytes(data)

    def sent_eof(self) -> None:
        self.stream.sent_eof()

    def received(self, line: bytes) -> dict[str, Any]:
        try:
            message = self.stream.receive(line)
        except StreamViolation as exc:
            raise AssertionError(
                f"the service broke the v1 stream ({exc}): {line[:2000]!r}"
            ) from None
        wire_schema.check_record(message)
        return message
