"""The optional ``truncated`` flag of an ``assistant`` record: the reply the output-token
limit still cut after the automatic continuations. Replay tolerates it (it changes no
item), and a record written before it existed reads as not truncated."""

from __future__ import annotations

import orjson

from magi_code.sessions.projection import project
from magi_code.sessions.records import (
    AssistantRecord,
    HeaderRecord,
    UserRecord,
    decode_line,
    encode_record,
)

TS = "2025-01-01T00:00:00.000Z"


def _assistant(seq: int, **fields: object) -> bytes:
    return encode_record({"type": "assistant", "turn_id": "t1", **fields}, seq, TS)


def test_the_flag_round_trips_and_defaults_to_false() -> None:
    marked = decode_line(_assistant(2, text="cut", truncated=True).rstrip(b"\n"))
    assert marked == AssistantRecord(2, "t1", "cut", continued=False, truncated=True)
    plain = _assistant(3, text="whole")
    assert b"truncated" not in plain
    assert decode_line(plain.rstrip(b"\n")) == AssistantRecord(3, "t1", "whole")
    assert _assistant(4, text="x", truncated=None) == _assistant(4, text="x")


def test_a_flag_that_is_not_a_boolean_makes_the_line_malformed() -> None:
    line = {"v": 1, "seq": 2, "ts": TS, "type": "assistant", "turn_id": "t1", "text": "x"}
    assert decode_line(orjson.dumps({**line, "truncated": "yes"})) is None
    assert decode_line(orjson.dumps({**line, "truncated": False})) is not None


def test_replay_shows_a_truncated_reply_as_its_text_and_an_empty_marker_as_nothing() -> None:
    records = [
        HeaderRecord(0, "s", TS),
        UserRecord(1, "t1", "question"),
        AssistantRecord(2, "t1", "part one ", continued=True),
        AssistantRecord(3, "t1", "part two", truncated=True),
        UserRecord(4, "t2", "again"),
        AssistantRecord(5, "t2", "already durable"),
        AssistantRecord(6, "t2", "", truncated=True),
    ]
    bodies = [item.body for item in project(records).items]
    assert [(b["role"], b["text"], b["last_part"]) for b in bodies] == [
        ("user", "question", True),
        ("assistant", "part one part two", True),  # one message, its increments joined
        ("user", "again", True),
        ("assistant", "already durable", True),
    ]
