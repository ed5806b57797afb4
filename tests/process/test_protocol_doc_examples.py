"""Every example in ``docs/protocol/`` is real service output, replayed and compared.

An example is a fenced block whose info string starts with ``jsonl example``::

    ```jsonl example setup=initialized settings=local reply=hello
    > {"protocol_version": 1, "kind": "request", ...}      (the client writes)
    < {"protocol_version": 1, "kind": "response", ...}     (the service writes)
    ```

A record may continue on indented lines. Each block runs against a fresh embedded
service (fresh ``MC_HOME`` and project): ``setup=initialized`` (the default) sends an
``initialize`` first that the block does not show; ``settings=local`` configures a custom
provider ``local`` (static models, pointed at the loopback fake provider);
``reply=<name>`` queues a scripted provider reply. The ``>`` records are sent in order;
each ``<`` record must equal the next record the service writes, except that opaque
values (session, turn and login IDs, cursors, event IDs, activity identities) only have
to correspond one-to-one, and timestamps, the server version and the login URL only
have to have their form. After the last record stdin is closed and nothing more may
arrive. IDs the block shows are mapped to the real ones before a record is sent.

``MC_UPDATE_DOC_EXAMPLES=1`` rewrites every block from a real run instead (the ``>``
records kept, the ``<`` records replaced by what the service wrote).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.fake_providers import FakeProviderServer, FakeUsage, Reply
from tests.support.protocol_docs import DOCS
from tests.support.service import ServiceProcess

FENCE = re.compile(r"^```jsonl example(?P<attrs>[^\n]*)\n(?P<body>.*?)^```$", re.M | re.S)
UPDATE = os.environ.get("MC_UPDATE_DOC_EXAMPLES") == "1"
# Opaque values that must correspond one-to-one between the page and the real run.
BOUND = (
    re.compile(r"^ses_[0-9a-z]{26}$"),
    re.compile(r"^turn_[0-9a-f]{24}$"),
    re.compile(r"^login_[0-9a-f]{24}$"),
    re.compile(r"^evt-[0-9]+$"),
    re.compile(r"^[a-z][a-z0-9-]*:[0-9a-f]{64}$"),
)
BOUND_KEYS = frozenset({"cursor", "next_cursor", "snapshot_cursor", "after"})
# Values that vary between runs and only need their form.
FORM = {
    "server_version": re.compile(r"^\S+$"),
    "updated_at": re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$"),
    "url": re.compile(r"^http://127\.0\.0\.1:9/oauth/authorize\?\S+$"),
}
REPLIES = {
    "hello": Reply(text=["Hel", "lo"], usage=FakeUsage(12, 7, 4, 0)),
}


@dataclass
class Example:
    page: Path
    attrs: dict[str, str]
    records: list[tuple[str, Any]]  # (">" | "<", record)
    span: tuple[int, int]  # the block body in the page text


def parse_one(page: Path, match: re.Match[str]) -> Iterator[tuple[str, Any]]:
    records: list[tuple[str, list[str]]] = []
    for line in match.group("body").splitlines():
        if line[:2] in ("> ", "< "):
            records.append((line[0], [line[2:]]))
        elif line.strip():
            assert records, f"{page.name}: text before the first record"
            records[-1][1].append(line)
    for d, lines in records:
        yield d, json.loads("\n".join(lines))


def parse(page: Path) -> Iterator[Example]:
    text = page.read_text(encoding="utf-8")
    for match in FENCE.finditer(text):
        attrs = dict(item.split("=", 1) for item in match.group("attrs").split())
        yield Example(page, attrs, list(parse_one(page, match)), match.span("body"))


def examples() -> list[Example]:
    return [ex for page in sorted(DOCS.glob("*.md")) for ex in parse(page)]


class Bindings:
    def __init__(self) -> None:
        self.page_to_real: dict[str, str] = {}
        self.real_to_page: dict[str, str] = {}

    def bind(self, page: str, real: str, where: str) -> None:
        known = self.page_to_real.get(page)
        assert known in (None, real), f"{where}: {page!r} was {known!r}, now {real!r}"
        back = self.real_to_page.get(real)
        assert back in (None, page), f"{where}: {real!r} shown as {back!r} and {page!r}"
        self.page_to_real[page] = real
        self.real_to_page[real] = page

    def to_real(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.page_to_real.get(value, value)
        if isinstance(value, list):
            return [self.to_real(v) for v in value]
        if isinstance(value, dict):
            return {k: self.to_real(v) for k, v in value.items()}
        return value

    def match(self, page: Any, real: Any, where: str = "$", key: str = "") -> None:
        if isinstance(page, str) and isinstance(real, str):
            if key in FORM:
                assert FORM[key].match(real), f"{where}: {real!r} has not the form of {key}"
                return
            if key in BOUND_KEYS or any(p.match(page) for p in BOUND):
                same = key in BOUND_KEYS or any(p.match(page) and p.match(real) for p in BOUND)
                assert same, f"{where}: {real!r} is not of the kind of {page!r}"
                self.bind(page, real, where)
                return
        if isinstance(page, dict) and isinstance(real, dict):
            assert list(page) == list(real), f"{where}: members {list(real)} != {list(page)}"
            for k in page:
                self.match(page[k], real[k], f"{where}.{k}", k)
            return
        if isinstance(page, list) and isinstance(real, list):
            assert len(page) == len(real), f"{where}: {len(real)} items, the page shows {len(page)}"
            for i, (p, r) in enumerate(zip(page, real, strict=True)):
                self.match(p, r, f"{where}[{i}]", key)
            return
        assert type(page) is type(real) and page == real, f"{where}: {real!r} != {page!r}"


def local_settings(home: Path, base_url: str) -> None:
    provider = {
        "api": "openai-chat",
        "base_url": base_url,
        "label": "Local model",
        "models": [{"id": "m1", "label": "Model one", "context_window": 32000}],
    }
    document = {"provider": "local", "model": "m1", "providers": {"local": provider}}
    (home / "settings.json").write_text(json.dumps(document))


async def _quiet_read(svc: ServiceProcess, quiet: float = 1.0) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while True:
        try:
            got.append(await svc.recv(timeout=quiet))
        except TimeoutError:
            return got


async def play(example: Example, home: Path, project: Path) -> list[tuple[str, Any]]:
    """Run one example; the records as they really were (for the update mode)."""
    with FakeProviderServer() as fake:
        if example.attrs.get("settings") == "local":
            local_settings(home, f"{fake.base_url}/v1")
        if "reply" in example.attrs:
            fake.enqueue(REPLIES[example.attrs["reply"]])
        env = {"MC_CODEX_AUTH_ISSUER": "http://127.0.0.1:9", "MC_OAUTH_CALLBACK_PORT": "0"}
        svc = await ServiceProcess.start(home, project, {**env, "MC_SERVICE_MODE": "embedded"})
        try:
            if example.attrs.get("setup", "initialized") == "initialized":
                await svc.initialize()
            return await _exchange(example, svc)
        finally:
            await svc.stop()


async def _exchange(example: Example, svc: ServiceProcess) -> list[tuple[str, Any]]:
    bindings = Bindings()
    real: list[tuple[str, Any]] = []
    where = f"{example.page.name} example at {example.span[0]}"
    # Update mode: opaque values the page sends are bound to the first real ones of
    # their kind, and to what the page already shows where it still matches.
    unbound = [v for d, r in example.records if d == ">" for v in _opaque(r)]
    for index, (direction, record) in enumerate(example.records):
        if direction == ">":
            sent = bindings.to_real(record)
            await svc.send(sent)
            real.append((">", sent))
            if UPDATE:
                got = await _quiet_read(svc)
                shown = _shown_after(example, index)
                for i, message in enumerate(got):
                    if i < len(shown):
                        with contextlib.suppress(AssertionError):
                            bindings.match(shown[i], message)
                    for value in _opaque(message):
                        _bind_first(bindings, unbound, value)
                real += [("<", m) for m in got]
        elif not UPDATE:
            message = await svc.recv()
            bindings.match(record, message, f"{where} record {index + 1}")
    await svc.close_stdin()
    rest = await svc.drain_stdout()
    assert UPDATE or rest == [], f"{where}: more output than the page shows: {rest}"
    assert await svc.wait() == 0
    return real


def _opaque(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        if any(p.match(value) for p in BOUND[:3]):
            yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _opaque(v)
    elif isinstance(value, list):
        for v in value:
            yield from _opaque(v)


def _bind_first(bindings: Bindings, unbound: list[str], real: str) -> None:
    if real in bindings.real_to_page:
        return
    kind = next(p for p in BOUND if p.match(real))
    for page in unbound:
        if page not in bindings.page_to_real and kind.match(page):
            bindings.bind(page, real, "update")
            return


def _shown_after(example: Example, index: int) -> list[Any]:
    shown = []
    for direction, record in example.records[index + 1 :]:
        if direction == ">":
            break
        shown.append(record)
    return shown


WIDTH = 92


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _layout(value: Any, indent: int) -> str:
    """Compact where it fits in ``WIDTH``; else members (items) packed into lines."""
    compact = _compact(value)
    if indent + len(compact) <= WIDTH or not isinstance(value, (dict, list)) or not value:
        return compact
    pad = " " * (indent + 2)
    pieces: list[str] = []
    entries = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    for key, item in entries:
        head = "" if key is None else f"{_compact(key)}: "
        text = head + _compact(item)
        if len(pad) + len(text) + 1 > WIDTH and isinstance(item, (dict, list)):
            text = head + _layout(item, indent + 2)
        pieces.append(text)
    lines: list[str] = []
    for piece in pieces:
        single = "\n" not in piece
        if lines and single and "\n" not in lines[-1]:
            candidate = f"{lines[-1]}, {piece}"
            if len(pad) + len(candidate) + 1 <= WIDTH:
                lines[-1] = candidate
                continue
        lines.append(piece)
    open_, close = ("{", "}") if isinstance(value, dict) else ("[", "]")
    body = ",\n".join(pad + line for line in lines)
    return f"{open_}\n{body}\n{' ' * indent}{close}"


def render_record(direction: str, record: Any) -> str:
    return f"{direction} " + _layout(record, 0).replace("\n", "\n  ")


@pytest.fixture
def service_mode() -> Iterator[str]:
    """Examples run in embedded mode only (the contract tests cover the daemon)."""
    yield "embedded"


@pytest.mark.parametrize(
    "index", range(len(examples())), ids=lambda i: f"{examples()[i].page.stem}-{i}"
)
async def test_doc_example(index: int, tmp_path: Path) -> None:
    example = examples()[index]
    home, project = tmp_path / "mc-home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    real = await play(example, home, project)
    if UPDATE:
        _rewrite(example, real)


def _rewrite(example: Example, real: list[tuple[str, Any]]) -> None:
    text = example.page.read_text(encoding="utf-8")
    for match in FENCE.finditer(text):
        if list(parse_one(example.page, match)) == list(example.records):
            body = "\n".join(render_record(d, r) for d, r in real) + "\n"
            start, end = match.span("body")
            example.page.write_text(text[:start] + body + text[end:], encoding="utf-8")
            return
    raise AssertionError("the example moved while updating")


def test_every_page_has_examples_and_they_cover_every_operation() -> None:
    found = examples()
    assert found
    sent = {r["method"] for ex in found for d, r in ex.records if d == ">"}
    shown = {r["event"] for ex in found for d, r in ex.records if d == "<" and r["kind"] == "event"}
    from magi_code.protocol.schema import definitions

    assert sent >= {op.name for op in definitions.OPERATIONS}, sorted(
        {op.name for op in definitions.OPERATIONS} - sent
    )
    assert shown >= {"turn.started", "turn.assistant_delta", "turn.activity", "turn.terminal"}
    assert shown >= {"auth.login.progress", "auth.login.terminal"}


def test_examples_are_compact_json_on_the_wire() -> None:
    for ex in examples():
        for _, record in ex.records:
            assert len(orjson.dumps(record)) + 1 <= 65536
