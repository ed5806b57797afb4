"""Request payload validation, derived from each operation's declared request shape.

``protocol/schema/definitions.py`` declares every request payload once; the generated
block of ``protocol/operations.py`` holds each one in the compact form below (a
:class:`Value` tree), and :func:`check_request` interprets it, so no operation has a
payload validator of its own. Its handler gets the payload only after every check
passed.

The order of the checks is part of the contract (the first failure is the answer):

1. the outer ``session_id``, for an operation that declares it checked first;
2. the payload's structure (``invalid_payload``, ``limit_exceeded``): an object's unknown
   members, then its members in their check order (``Value.order``, else declared
   order), then its rules. An object checks ``by_member`` (each member's checks in turn)
   or ``by_constraint`` (every member's type, then every member's next constraint kind,
   in :data:`CONSTRAINTS` order). A value's own checks run in :data:`CONSTRAINTS` order;
   array items are checked one by one after the array's own bounds;
3. the checks whose code names a problem with one value (any other code: a session ID,
   a scope), in the order they were met, then the outer ``session_id`` (declared checked
   after the payload).

Structural bounds every record has (``max_string_bytes``, ``max_array_items``, …) were
checked when the record was decoded; a constraint here is an operation's own bound.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any, Final, Literal

from magi_code.dataclass import dataclass
from magi_code.protocol.bounds import string_fits
from magi_code.protocol.errors import ErrorCode, ServiceError

Kind = Literal["string", "integer", "boolean", "array", "object"]
# Every constraint kind, in the order a value's checks run (``by_constraint`` objects
# check each kind across their members before the next).
CONSTRAINTS: Final = (
    "type",
    "closed",
    "enum",
    "min_length",
    "max_length",
    "max_bytes",
    "pattern",
    "non_blank",
    "minimum",
    "maximum",
    "min_items",
    "max_items",
    "items",
    "members",
)
# Codes of the structure checks; any other code is a value's problem, checked after them.
STRUCTURAL: Final = frozenset({ErrorCode.INVALID_PAYLOAD, ErrorCode.LIMIT_EXCEEDED})
_TYPES: Final[Mapping[str, type]] = {
    "string": str,
    "integer": int,
    "boolean": bool,
    "array": list,
    "object": dict,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Value:
    """What one request value must be: a request shape of ``protocol/schema/model.py`` in
    the form this module checks (attributes as there; unset: no such constraint)."""

    type: Kind
    nullable: bool = False
    # constraint -> its code, where it is not ``invalid_payload``
    codes: tuple[tuple[str, ErrorCode], ...] = ()
    enum: tuple[str, ...] | None = None
    min_length: int | None = None
    max_length: int | None = None
    max_bytes: int | None = None
    pattern: str | None = None
    non_blank: bool = False
    minimum: int | None = None
    maximum: int | None = None
    min_items: int | None = None
    max_items: int | None = None
    items: Value | None = None
    members: tuple[Member, ...] = ()
    rules: tuple[Rule, ...] = ()
    by_constraint: bool = False
    # Members checked first, in this order (the others follow in declared order).
    order: tuple[str, ...] = ()

    def code(self, constraint: str) -> ErrorCode:
        return next((c for name, c in self.codes if name == constraint), ErrorCode.INVALID_PAYLOAD)


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    name: str
    value: Value
    required: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """At least one of ``names`` is present; or, with ``when``, none of ``names`` is
    present while member ``when`` equals ``equals``."""

    names: tuple[str, ...]
    when: str | None = None
    equals: str | None = None
    code: ErrorCode = ErrorCode.INVALID_PAYLOAD


@functools.cache
def _pattern(source: str) -> re.Pattern[str]:
    return re.compile(source)


class _Checker:
    """One request's checks: raises the first structural failure, remembers the others."""

    def __init__(self) -> None:
        self.later: list[ErrorCode] = []

    def fail(self, value: Value, constraint: str) -> None:
        self.fail_with(value.code(constraint))

    def fail_with(self, code: ErrorCode) -> None:
        if code in STRUCTURAL:
            raise ServiceError(code)
        self.later.append(code)

    def raise_later(self) -> None:
        if self.later:
            raise ServiceError(self.later[0])

    def check(self, value: Value, data: Any) -> None:
        for constraint in CONSTRAINTS:
            self.constraint(value, data, constraint)
            if data is None:
                return

    def constraint(self, value: Value, data: Any, constraint: str) -> None:
        """Check one constraint kind of ``value`` on ``data`` (``None``: checked by
        ``type`` alone)."""
        if constraint == "type":
            # Decided at once whatever its code: nothing else can be checked on it.
            if (data is None and not value.nullable) or (
                data is not None
                and (
                    not isinstance(data, _TYPES[value.type])
                    or (value.type == "integer" and isinstance(data, bool))
                )
            ):
                raise ServiceError(value.code("type"))
            return
        if data is None:
            return
        if constraint == "members":
            self.members(value, data)
        elif constraint == "items":
            if value.items is not None:
                for item in data:
                    self.check(value.items, item)
        elif not _satisfies(value, data, constraint):
            self.fail(value, constraint)

    def members(self, value: Value, data: dict[str, Any]) -> None:
        declared = {m.name: m for m in value.members}
        ordered = [declared[name] for name in value.order]
        ordered += [m for m in value.members if m.name not in value.order]
        if value.by_constraint:
            for constraint in CONSTRAINTS:
                for member in ordered:
                    self.member(value, member, data, constraint)
        else:
            for member in ordered:
                for constraint in CONSTRAINTS:
                    self.member(value, member, data, constraint)
        for rule in value.rules:
            if rule.when is None:
                broken = not any(name in data for name in rule.names)
            else:
                broken = data.get(rule.when) == rule.equals and any(
                    name in data for name in rule.names
                )
            if broken:
                self.fail_with(rule.code)

    def member(self, parent: Value, member: Member, data: dict[str, Any], constraint: str) -> None:
        if member.name in data:
            self.constraint(member.value, data[member.name], constraint)
        elif member.required and constraint == "type":
            self.fail(parent, "required")


def _satisfies(value: Value, data: Any, constraint: str) -> bool:
    if constraint == "closed":
        return value.type != "object" or {m.name for m in value.members}.issuperset(data)
    limit = getattr(value, constraint)
    if limit is None or limit is False:
        return True
    if constraint == "enum":
        return bool(data in limit)
    if constraint in ("min_length", "min_items"):
        return bool(len(data) >= limit)
    if constraint in ("max_length", "max_items"):
        return bool(len(data) <= limit)
    if constraint == "max_bytes":
        return string_fits(data, limit)
    if constraint == "pattern":
        return _pattern(limit).fullmatch(data) is not None
    if constraint == "non_blank":
        return bool(data.strip())
    if constraint == "minimum":
        return bool(data >= limit)
    if constraint == "maximum":
        return bool(data <= limit)
    raise AssertionError(constraint)


def check_request(
    payload_shape: Value,
    payload: Any,
    session_id: str | None,
    session_shape: Value | None = None,
    *,
    session_first: bool = False,
) -> None:
    """Check a request's payload and, where the operation checks it (``session_shape``:
    what a session ID is), its outer ``session_id`` in the contract's order (the module
    docstring); raises ``ServiceError`` with the first failure's code."""
    checker = _Checker()
    session = session_shape if session_id is not None else None
    if session is not None and session_first:
        checker.check(session, session_id)
        checker.raise_later()
    checker.check(payload_shape, payload)
    if session is not None and not session_first:
        checker.check(session, session_id)
    checker.raise_later()
