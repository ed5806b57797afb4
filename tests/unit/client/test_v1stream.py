"""The reference v1 consumer against the consumer fixtures, and its input-side framing.

Each fixture in ``tests/fixtures/application_service/consumer/`` is a synthetic service
stream labelled ``accept`` or ``reject-before-mutation``. The validator must accept every
step of an ``accept`` fixture; for a ``reject-before-mutation`` fixture it must accept
every step but the last, reject the last with the labelled violation, and keep its state
exactly as it was before that step. Each fixture runs twice: with the client's requests
given as objects and as the bytes a client writes. The validator also agrees with the
consumer JSON Schema on every fixture: a record the schema refuses is a violation, and
the validator refuses a record the schema accepts only for what the record alone cannot
show (framing, correlation, order), as the fixture's ``detected_by`` says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from magi_code.client import v1stream
from magi_code.client.v1stream import StreamViolation, V1StreamValidator
from tests.support import wire_schema

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "application_service" / "consumer"
STEP_KINDS = {
    "client_sends",
    "client_sends_text",
    "service_writes",
    "service_writes_text",
    "service_writes_padded",
    "service_ends",
}


def fixture_files() -> list[Path]:
    return sorted(FIXTURES.glob("*.jsonl"))


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    header, *steps = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
    return header, steps


def padded(record: Any, total: int) -> bytes:
    """``record`` with every ``"$PAD"`` filled so the compact line is ``total`` bytes."""
    text = orjson.dumps(record).decode()
    pads = text.count('"$PAD"')
    fill = total - 1 - (len(text.encode()) - pads * len("$PAD"))
    size, extra = divmod(fill, pads)
    for i in range(pads):
        text = text.replace('"$PAD"', '"' + "a" * (size + (1 if i < extra else 0)) + '"', 1)
    data = text.encode() + b"\n"
    assert len(data) == total
    return data


def service_line(step: dict[str, Any]) -> bytes | None:
    if "service_writes" in step:
        return orjson.dumps(step["service_writes"]) + b"\n"
    if "service_writes_text" in step:
        text: str = step["service_writes_text"]
        return text.encode()
    if "service_writes_padded" in step:
        spec = step["service_writes_padded"]
        return padded(spec["record"], spec["total_bytes"])
    return None


def run(path: Path, *, as_bytes: bool) -> tuple[StreamViolation | None, int]:
    """Play a fixture; the violation of its last step (if any) and the step count."""
    _header, steps = load(path)
    validator = V1StreamValidator()
    for index, step in enumerate(steps, start=1):
        assert set(step) <= STEP_KINDS and len(step) == 1, (path.name, step)
        last = index == len(steps)
        if "client_sends" in step:
            if as_bytes:
                validator.sent_bytes(orjson.dumps(step["client_sends"]) + b"\n")
            else:
                validator.sent(step["client_sends"])
            continue
        if "client_sends_text" in step:
            validator.sent_bytes(step["client_sends_text"].encode())
            continue
        before = validator.snapshot()
        try:
            line = service_line(step)
            if line is None:
                validator.finish()
            else:
                validator.receive(line)
        except StreamViolation as exc:
            assert last, f"{path.name} step {index} rejected: {exc}"
            assert validator.snapshot() == before, f"{path.name}: state changed by the rejection"
            return exc, index
    return None, len(steps)


@pytest.mark.parametrize("as_bytes", [False, True], ids=["objects", "bytes"])
@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: p.stem)
def test_consumer_fixture(path: Path, as_bytes: bool) -> None:
    header, _steps = load(path)
    violation, _ = run(path, as_bytes=as_bytes)
    if header["verdict"] == "accept":
        assert violation is None
    else:
        assert header["verdict"] == "reject-before-mutation"
        assert violation is not None, f"{path.name}: the last step was accepted"
        assert violation.reason == header["violation"], (path.name, str(violation))


def test_fixture_headers_and_names() -> None:
    files = fixture_files()
    assert len(files) >= 50
    for path in files:
        header, steps = load(path)
        assert header["consumer_fixture_schema_version"] == 2
        assert header["fixture"] == path.stem
        assert header["reason"]
        assert path.stem.startswith(
            {"accept": "accept.", "reject-before-mutation": "reject."}[header["verdict"]]
        )
        assert ("violation" in header) == (header["verdict"] != "accept")
        assert header.get("detected_by") in (
            {None} if header["verdict"] == "accept" else {"framing", "record", "stream"}
        )
        assert steps and any(
            s.keys()
            & {"service_writes", "service_writes_text", "service_writes_padded", "service_ends"}
            for s in steps
        )


def test_fixtures_cover_the_required_cases() -> None:
    labels = {load(p)[0].get("violation") for p in fixture_files()}
    for needed in (
        "sequence_gap",
        "sequence_repeat",
        "sequence_out_of_order",
        "event_after_terminal",
        "unknown_request_id",
        "record_too_large",
        "limit_exceeded",
        "payload_too_large",
        "unknown_kind",
        "unknown_event",
        "unknown_value",
        "invalid_payload",
    ):
        assert needed in labels, needed
    names = {p.stem for p in fixture_files()}
    for needed in (
        "accept.unknown_members",
        "accept.optional_members_added",
        "accept.advertisement_extensions",
        "accept.defined_fallbacks",
        "reject.unknown_event",
        "reject.advertised_unknown_event",
        "reject.unknown_activity_kind",
        "reject.unknown_tool_transport",
        "reject.unknown_terminal_status",
        "reject.unknown_login_terminal_state",
        "reject.limit_extension_not_an_integer",
        "reject.duplicate_terminal",
        "reject.string_over_max_bytes",
    ):
        assert needed in names, needed


def test_every_reject_fixture_is_accepted_without_its_last_step() -> None:
    """The rejection is due to the last step alone (the prefix is a valid stream)."""
    for path in fixture_files():
        header, steps = load(path)
        if header["verdict"] == "accept":
            continue
        validator = V1StreamValidator()
        for step in steps[:-1]:
            if "client_sends" in step:
                validator.sent(step["client_sends"])
            elif "client_sends_text" in step:
                validator.sent_bytes(step["client_sends_text"].encode())
            else:
                line = service_line(step)
                assert line is not None
                validator.receive(line)


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: p.stem)
def test_the_validator_agrees_with_the_consumer_schema(path: Path) -> None:
    """Every record the schema refuses, the validator refuses; a reject fixture's last
    record is refused by the schema exactly when the fixture says the record alone shows
    the violation (``detected_by: record``)."""
    header, steps = load(path)
    violation, rejected_at = run(path, as_bytes=False)
    for index, step in enumerate(steps, start=1):
        line = service_line(step)
        if line is None:
            continue
        last = index == len(steps) and header["verdict"] != "accept"
        layer = header.get("detected_by") if last else None
        if layer == "framing":
            assert _not_a_record(line), f"{path.name}: the schema could check this line"
            continue
        schema_ok = not wire_schema.errors(wire_schema.CONSUMER, orjson.loads(line))
        assert schema_ok == (layer != "record"), (path.name, index, layer)
        if not schema_ok:
            assert violation is not None and rejected_at == index, (path.name, index)


def _not_a_record(line: bytes) -> bool:
    """A line no schema sees: over the record bound, without its newline, or not JSON."""
    if len(line) > 65536 or not line.endswith(b"\n"):
        return True
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return True
    return False


# -- input-side framing (what the client wrote) ----------------------------------------------


def _status(request_id: str) -> bytes:
    return orjson.dumps(
        {
            "protocol_version": 1,
            "kind": "request",
            "request_id": request_id,
            "method": "status",
            "payload": {},
        }
    )


def _answer(request_id: str | None) -> bytes:
    return (
        orjson.dumps(
            {
                "protocol_version": 1,
                "kind": "response",
                "request_id": request_id,
                "session_id": None,
                "method": "status",
                "payload": {"service": "ready", "provider_auth_ready": False},
                "error": None,
            }
        )
        + b"\n"
    )


def test_sent_bytes_frames_like_the_service() -> None:
    validator = V1StreamValidator()
    record = _status("a")
    validator.sent_bytes(record[:10])
    validator.sent_bytes(record[10:] + b"\r\n" + _status("b") + b"\n")
    validator.receive(_answer("a"))
    validator.receive(_answer("b"))
    # An over-long record is answered uncorrelated, even if it carries a safe ID.
    validator.sent_bytes(b'{"request_id":"c","x":"' + b"y" * 70000)
    validator.sent_bytes(b'"}\n' + _status("d") + b"\n")
    with pytest.raises(StreamViolation):
        validator.receive(_answer("c"))
    validator.receive(_answer("d"))
    # A last record without its newline still counts at EOF.
    validator.sent_bytes(_status("e"))
    with pytest.raises(StreamViolation):
        validator.receive(_answer("e"))
    validator.sent_eof()
    validator.receive(_answer("e"))
    validator.finish()


def test_a_record_exactly_at_the_bound_is_correlated() -> None:
    validator = V1StreamValidator()
    body = _status("big")
    validator.sent_bytes(body[:-1] + b" " * (65536 - len(body) - 1) + b"}\n")
    validator.receive(_answer("big"))


def test_unsafe_ids_and_names_are_echoed_as_null() -> None:
    assert v1stream.is_safe_id("r-1") and not v1stream.is_safe_id("")
    assert not v1stream.is_safe_id("a\nb") and not v1stream.is_safe_id("é" * 65)
    assert v1stream.is_safe_name("session.list") and not v1stream.is_safe_name("Status")
    assert not v1stream.is_safe_name("1abc") and not v1stream.is_safe_name("a" * 65)
    validator = V1StreamValidator()
    validator.sent({"request_id": "r-1", "method": "Bad Name", "payload": {}})
    line = orjson.loads(_answer("r-1"))
    line["method"] = None
    validator.receive(orjson.dumps(line) + b"\n")


def test_finish_reports_what_is_open_without_changing_state() -> None:
    validator = V1StreamValidator()
    validator.sent(orjson.loads(_status("open")))
    before = validator.snapshot()
    with pytest.raises(StreamViolation) as exc:
        validator.finish()
    assert exc.value.reason == "unanswered_request"
    assert validator.snapshot() == before
