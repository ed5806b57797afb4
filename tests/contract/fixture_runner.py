"""Executes the language-neutral scenarios in tests/fixtures/application_service/."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol

import orjson

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "application_service"


def scenario_files() -> list[Path]:
    return sorted((FIXTURES / "scenarios").glob("*.jsonl"))


def advertised() -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads((FIXTURES / "advertised.json").read_bytes())
    return data


class ScenarioService(Protocol):
    """What a scenario drives: a real service process, or the in-memory bridge."""

    async def send(self, record: Any) -> None: ...

    async def send_raw(self, data: bytes) -> None: ...

    async def close_stdin(self) -> None: ...

    async def recv(self, timeout: float = ...) -> dict[str, Any]: ...

    async def wait(self, timeout: float = ...) -> int: ...


class Mismatch(AssertionError):
    pass


class Matcher:
    def __init__(self, sets: dict[str, Any]) -> None:
        self.bound: dict[str, str] = {}
        self.sets = sets

    def bind_all(self, pattern: Any, actual: Any) -> None:
        """Bind every ``$bind`` first, so a ``$ref`` may precede its binding in key order."""
        if isinstance(pattern, dict) and "$bind" in pattern:
            if isinstance(actual, str) and actual:
                self.bound[pattern["$bind"]] = actual
        elif isinstance(pattern, dict) and isinstance(actual, dict):
            for key, sub in pattern.items():
                if key in actual:
                    self.bind_all(sub, actual[key])
        elif isinstance(pattern, list) and isinstance(actual, list):
            for sub, item in zip(pattern, actual, strict=False):
                self.bind_all(sub, item)

    def match(self, pattern: Any, actual: Any, where: str = "$") -> None:
        if isinstance(pattern, str) and pattern.startswith("$"):
            self._special(pattern, actual, where)
        elif isinstance(pattern, dict) and ("$bind" in pattern or "$ref" in pattern):
            self._binding(pattern, actual, where)
        elif isinstance(pattern, dict):
            if not isinstance(actual, dict):
                raise Mismatch(f"{where}: expected object, got {actual!r}")
            for key, sub in pattern.items():
                if key not in actual:
                    raise Mismatch(f"{where}: missing key {key!r}")
                self.match(sub, actual[key], f"{where}.{key}")
        elif isinstance(pattern, list):
            if not isinstance(actual, list) or len(actual) != len(pattern):
                raise Mismatch(f"{where}: expected list of {len(pattern)}, got {actual!r}")
            for i, (sub, item) in enumerate(zip(pattern, actual, strict=True)):
                self.match(sub, item, f"{where}[{i}]")
        elif type(pattern) is not type(actual) or pattern != actual:
            raise Mismatch(f"{where}: expected {pattern!r}, got {actual!r}")

    def _special(self, pattern: str, actual: Any, where: str) -> None:
        if pattern == "$any":
            return
        if pattern == "$string":
            ok = isinstance(actual, str) and actual != ""
        elif pattern == "$int":
            ok = isinstance(actual, int) and not isinstance(actual, bool)
        elif pattern in ("$operations", "$events"):
            expected = self.sets[pattern[1:]]
            ok = isinstance(actual, list) and sorted(actual) == sorted(expected)
            ok = ok and len(set(actual)) == len(actual)
        else:
            ok = pattern == actual
        if not ok:
            raise Mismatch(f"{where}: {actual!r} does not match {pattern}")

    def _binding(self, pattern: dict[str, str], actual: Any, where: str) -> None:
        if not isinstance(actual, str) or not actual:
            raise Mismatch(f"{where}: expected an opaque id, got {actual!r}")
        if "$bind" in pattern:
            self.bound[pattern["$bind"]] = actual
        elif self.bound.get(pattern["$ref"]) != actual:
            raise Mismatch(f"{where}: {actual!r} is not the bound {pattern['$ref']}")


def substitute(value: Any, bound: dict[str, str]) -> Any:
    """Replace ``{"$ref": name}`` in an outgoing record with the bound opaque ID."""
    if isinstance(value, dict):
        if set(value) == {"$ref"}:
            return bound[value["$ref"]]
        return {k: substitute(v, bound) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, bound) for v in value]
    return value


def padded(record: Any, total: int) -> bytes:
    text = orjson.dumps(record).decode()
    pads = text.count('"$PAD"')
    fill = total - 1 - (len(text.encode()) - pads * len("$PAD"))
    size, extra = divmod(fill, pads)
    for i in range(pads):
        text = text.replace('"$PAD"', '"' + "a" * (size + (1 if i < extra else 0)) + '"', 1)
    data = text.encode() + b"\n"
    assert len(data) == total
    return data


async def run_scenario(path: Path, service: ScenarioService) -> None:
    steps = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    header, *steps = steps
    assert header["fixture_schema_version"] == 1
    matcher = Matcher(advertised())
    for index, step in enumerate(steps, start=1):
        where = f"{header['scenario']} step {index}"
        if "send" in step:
            await service.send(substitute(step["send"], matcher.bound))
        elif "send_text" in step:
            await service.send_raw(step["send_text"].encode())
        elif "send_hex" in step:
            await service.send_raw(bytes.fromhex(step["send_hex"]))
        elif "send_repeat" in step:
            spec = step["send_repeat"]
            data = spec["prefix"] + spec["text"] * spec["count"] + spec["suffix"]
            await service.send_raw(data.encode())
        elif "send_padded" in step:
            spec = step["send_padded"]
            await service.send_raw(padded(spec["record"], spec["total_bytes"]))
        elif "close_stdin" in step:
            await service.close_stdin()
        elif "expect" in step:
            message = await service.recv()
            matcher.bind_all(step["expect"], message)
            try:
                matcher.match(step["expect"], message)
            except Mismatch as exc:
                raise Mismatch(f"{where}: {exc}") from None
        elif "expect_eof" in step:
            with contextlib.suppress(EOFError):
                extra = await service.recv()
                raise Mismatch(f"{where}: expected EOF, got {extra!r}")
            assert await service.wait() == 0
        else:
            raise AssertionError(f"{where}: unknown step {step!r}")
