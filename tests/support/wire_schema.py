"""The generated v1 JSON Schemas as validators, compiled once per test process.

``jsonschema``'s 2020-12 validator, extended with the annotations the generator emits
that plain JSON Schema cannot express: ``x-max-utf8-bytes`` (a UTF-8 byte bound),
``x-printable`` (``str.isprintable``) and ``x-max-json-bytes`` (the compact encoding's
UTF-8 bytes). ``check_record`` validates one service-written
record: its envelope, then its payload against the method's or event's document, and
fails with the record, the document and the schema path.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from magi_code.protocol.schema import (
    approvals,
    definitions,
    rewind,
    schema_documents,
    session,
)
from magi_code.protocol.schema.model import MAX_JSON_BYTES, MAX_UTF8_BYTES, PRINTABLE

_OPERATIONS = frozenset(op.name for op in definitions.OPERATIONS)
_EVENTS = {ev.name: ev for ev in definitions.EVENTS}


def _max_utf8_bytes(
    validator: Validator, limit: int, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if isinstance(instance, str):
        size = len(instance.encode("utf-8", "surrogatepass"))
        if size > limit:
            yield ValidationError(f"{size} UTF-8 bytes is more than {limit}")


def _printable(
    validator: Validator, wanted: bool, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if wanted and isinstance(instance, str) and not instance.isprintable():
        yield ValidationError(f"{instance!r} is not printable")


def _max_json_bytes(
    validator: Validator, limit: int, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if isinstance(instance, dict):
        size = len(orjson.dumps(instance))
        if size > limit:
            yield ValidationError(f"{size} bytes of compact JSON is more than {limit}")


WireValidator = jsonschema.validators.extend(
    Draft202012Validator,
    {MAX_UTF8_BYTES: _max_utf8_bytes, PRINTABLE: _printable, MAX_JSON_BYTES: _max_json_bytes},
)


# The consumer bundle, by the name ``validator`` and ``errors`` take.
CONSUMER = "consumer:v1"


@functools.cache
def documents() -> dict[str, dict[str, Any]]:
    """Every strict document by name (the v2 frames' too), and the consumer bundle as
    ``CONSUMER``."""
    v1 = schema_documents()
    docs = {**v1, **approvals.documents(), **rewind.documents(), **session.documents()}
    return {**docs, CONSUMER: schema_documents("consumer")["v1"]}


@functools.cache
def validator(name: str) -> Validator:
    document = documents()[name]
    WireValidator.check_schema(document)
    result: Validator = WireValidator(document)
    return result


def errors(name: str, instance: Any) -> list[ValidationError]:
    return sorted(validator(name).iter_errors(instance), key=lambda e: list(e.path))


def describe(name: str, instance: Any, found: list[ValidationError]) -> str:
    lines = [f"record fails schema {name!r}: {str(instance)[:2000]}"]
    for error in found[:5]:
        lines.append(
            f"  at {error.json_path}: {error.message[:300]} "
            f"(schema path {'/'.join(map(str, error.schema_path))})"
        )
    return "\n".join(lines)


def check(name: str, instance: Any) -> None:
    found = errors(name, instance)
    if found:
        raise AssertionError(describe(name, instance, found))


def check_record(record: Mapping[str, Any]) -> None:
    """One record the service wrote, against the exact v1 schemas."""
    kind = record.get("kind")
    if kind == "response":
        check("envelope.response", record)
        method = record["method"]
        if record["error"] is None and method in _OPERATIONS:
            check(f"response.{method}", record["payload"])
    elif kind == "event":
        check("envelope.event", record)
        name = record["event"]
        check(f"event.{name}", record["payload"])
        stream = _EVENTS[name].stream
        assert isinstance(record["request_id"], str), f"uncorrelated event: {record}"
        if stream == "turn":
            assert isinstance(record["session_id"], str), f"turn event without session: {record}"
        else:
            assert record["session_id"] is None, f"login event with a session: {record}"
    else:
        raise AssertionError(f"the service wrote a record of kind {kind!r}: {record}")
