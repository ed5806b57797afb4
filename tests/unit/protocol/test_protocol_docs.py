"""The reference tables in docs/protocol/ are current, and the pages cover everything.

Every generated block is re-rendered from the v1 definitions; a stale page is rewritten
and the test fails (commit the result). The examples are checked against the real
service by ``tests/process/test_protocol_doc_examples.py``.
"""

from __future__ import annotations

import re

import pytest

from magi_code.protocol.schema import definitions as v1
from tests.support.protocol_docs import DOCS, keys, refreshed, with_every_operation

PAGES = ("index.md", "envelope.md", "operations.md", "events.md", "errors.md")


def test_the_pages_exist() -> None:
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(PAGES)


def test_generated_blocks_are_current() -> None:
    stale = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        fresh = refreshed(with_every_operation(text) if page.name == "operations.md" else text)
        if fresh != text:
            page.write_text(fresh, encoding="utf-8")
            stale.append(page.name)
    if stale:
        pytest.fail(f"regenerated stale reference tables (commit them): {stale}")


def test_every_operation_event_and_code_is_documented() -> None:
    found = {key for page in DOCS.glob("*.md") for key in keys(page.read_text())}
    for op in v1.OPERATIONS:
        assert {f"request:{op.name}", f"response:{op.name}"} <= found, op.name
        assert f"operation-errors:{op.name}" in found, op.name
    for ev in v1.EVENTS:
        assert f"event:{ev.name}" in found, ev.name
    assert {"errors", "limits", "union:activity", "union:replay-item"} <= found
    assert {"envelope:request", "envelope:response", "envelope:event", "envelope:error"} <= found


def test_pages_refer_to_nothing_outside_the_repository() -> None:
    for page in DOCS.glob("*.md"):
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)]+)\)", text):
            assert not target.startswith(("http:", "https:", "/", "..")), (page.name, target)
            path = target.split("#", 1)[0]
            assert not path or (DOCS / path).exists(), (page.name, target)
        assert "../shared" not in text and "shared/" not in text, page.name


def test_links_to_headings_resolve() -> None:
    anchors: dict[str, set[str]] = {}
    for page in DOCS.glob("*.md"):
        heads = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M)
        anchors[page.name] = {_anchor(h) for h in heads}
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)]+)\)", page.read_text(encoding="utf-8")):
            path, _, anchor = target.partition("#")
            if anchor:
                assert anchor in anchors[path or page.name], (page.name, target)


def _anchor(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")
