"""Checkpoints, fork and rewind on real files (RFC-0002 §6.16, docs/sessions.md): blobs
are private, content-addressed and bounded with the oldest evicted; a rewind record
hides what followed its point from replay and from the next turn's context; a fork
copies exactly the history up to its point; a rewind plan restores byte for byte, leaves
a file changed outside the agent alone (unless forced) and reports an evicted checkpoint
as not restorable."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from magi_code.sessions import checkpoints
from magi_code.sessions.checkpoints import Checkpoints, digest
from magi_code.sessions.listing import LibraryQuery
from magi_code.sessions.projection import start_cursor
from magi_code.sessions.records import RewindRecord, decode_line, encode_record
from magi_code.sessions.rewind import commit_rewind, plan_rewind, rewind_answer
from magi_code.sessions.store import NotTurnBoundary, SessionStore, StaleCursor


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


def _turn(lease: Any, turn_id: str, prompt: str, answer: str) -> None:
    lease.append({"type": "user", "turn_id": turn_id, "text": prompt})
    lease.append({"type": "assistant", "turn_id": turn_id, "text": answer})
    lease.append(
        {"type": "terminal", "turn_id": turn_id, "status": "completed", "assistant_text": answer}
    )


def _change(
    lease: Any, blobs: Checkpoints, root: Path, path: str, before: bytes | None, after: bytes | None
) -> None:
    if before is not None:
        blobs.save(before)
    lease.append(
        {
            "type": "file_change",
            "turn_id": "t2",
            "root": str(root),
            "path": path,
            "before": digest(before),
            "after": digest(after),
        }
    )


def _items(store: SessionStore, session_id: str) -> list[dict[str, object]]:
    page = store.replay(session_id, None, 32)
    return page["events"]  # type: ignore[return-value]


def test_a_rewind_record_decodes_and_goes_back_only() -> None:
    line = encode_record({"type": "rewind", "to_seq": 3}, 9, "2025-01-01T00:00:00.000Z")
    assert decode_line(line.rstrip(b"\n")) == RewindRecord(9, 3)
    with pytest.raises(ValueError):
        encode_record({"type": "rewind", "to_seq": 9}, 9, "2025-01-01T00:00:00.000Z")


def test_blobs_are_private_content_addressed_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "MAX_CHECKPOINT_BLOBS", 2)
    session_dir = tmp_path / "s"
    session_dir.mkdir()
    blobs = Checkpoints(session_dir)
    first = blobs.save(b"one")
    assert blobs.save(b"one") == first == digest(b"one")
    assert stat.S_IMODE(os.stat(session_dir / f"ckpt-{first}").st_mode) == 0o600
    os.utime(session_dir / f"ckpt-{first}", ns=(1, 1))  # the least recently kept
    blobs.save(b"two")
    blobs.save(b"three")
    assert blobs.load(first) is None  # evicted
    assert blobs.load(digest(b"two")) == b"two"
    assert blobs.load(digest(b"three")) == b"three"
    assert len([n for n in os.listdir(session_dir) if n.startswith("ckpt-")]) == 2
    # A blob whose bytes no longer match its name is not restored from.
    (session_dir / f"ckpt-{digest(b'two')}").write_bytes(b"tampered")
    assert blobs.load(digest(b"two")) is None


def test_fork_copies_exactly_the_history_up_to_its_point(
    store: SessionStore, tmp_path: Path
) -> None:
    project = tmp_path / "p"
    project.mkdir()
    original = store.create(project)
    with store.acquire_writer_lease(original) as lease:
        _turn(lease, "t1", "first", "one")
        _turn(lease, "t2", "second", "two")
    items = _items(store, original)
    after_one = str(items[2]["cursor"])
    item = store.fork(original, after_one)
    fork = str(item["session_id"])
    assert item["forked_from"] == {"session_id": original, "at_cursor": after_one}
    strip = lambda rows: [{k: v for k, v in r.items() if k != "cursor"} for r in rows]  # noqa: E731
    assert strip(_items(store, fork)) == strip(items[:3])
    assert [*store.load_context(fork).records] == [*store.load_context(original).records][:3]
    listed = {i["session_id"]: i for i in store.library(LibraryQuery())["sessions"]}  # type: ignore[union-attr]
    assert listed[original]["forks"] == [fork]
    assert listed[fork]["forked_from"]["session_id"] == original
    with pytest.raises(NotTurnBoundary):
        store.fork(original, str(items[1]["cursor"]))
    with pytest.raises(StaleCursor):
        store.fork(original, "AAAA")
    # The start cursor forks an empty conversation.
    empty = store.fork(original, start_cursor(original))
    assert _items(store, str(empty["session_id"])) == []


def test_rewind_restores_files_and_hides_what_followed(store: SessionStore, tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    root = project.resolve()
    (root / "kept.bin").write_bytes(b"\x00\xffagent")
    (root / "hand.txt").write_bytes(b"agent\n")
    (root / "made.txt").write_bytes(b"made")
    (root / "gone.txt").write_bytes(b"later")
    session_id = store.create(project)
    blobs = Checkpoints(store.session_dir(session_id))
    with store.acquire_writer_lease(session_id) as lease:
        _turn(lease, "t1", "first", "one")
        lease.append({"type": "user", "turn_id": "t2", "text": "second"})
        _change(lease, blobs, root, "kept.bin", b"\x00\xffbefore", b"\x00\xffmiddle")
        _change(lease, blobs, root, "kept.bin", b"\x00\xffmiddle", b"\x00\xffagent")
        _change(lease, blobs, root, "hand.txt", b"before\n", b"agent\n")
        _change(lease, blobs, root, "made.txt", None, b"made")
        _change(lease, blobs, root, "gone.txt", b"x" * 10, b"later")
        lease.append(
            {"type": "terminal", "turn_id": "t2", "status": "completed", "assistant_text": ""}
        )
    # The blob of gone.txt's old content is lost (evicted).
    os.unlink(store.session_dir(session_id) / f"ckpt-{digest(b'x' * 10)}")
    (root / "hand.txt").write_bytes(b"by hand\n")
    cursor = str(_items(store, session_id)[2]["cursor"])

    plan = plan_rewind(store, session_id, cursor)
    states = {f.path: f.state for f in plan.files}
    assert states == {
        "kept.bin": "restore",
        "hand.txt": "conflict",
        "made.txt": "restore",
        "gone.txt": "not_restorable",
    }
    assert [m.get("text") for m in plan.messages] == ["second", None]
    with store.acquire_writer_lease(session_id) as lease:
        _, results = commit_rewind(store, lease, cursor, True, False)
    assert results == ["restored", "conflict", "restored", "not_restorable"]
    assert (root / "kept.bin").read_bytes() == b"\x00\xffbefore"
    assert (root / "hand.txt").read_bytes() == b"by hand\n"
    assert not (root / "made.txt").exists()
    assert (root / "gone.txt").read_bytes() == b"later"
    assert [i["text"] for i in _items(store, session_id) if "text" in i] == ["first", "one"]
    context = store.load_context(session_id)
    assert [getattr(r, "text", None) for r in context.records] == ["first", "one", None]
    # The changes are taken back: nothing is left to rewind.
    again = plan_rewind(store, session_id, cursor)
    assert again.files == () and again.messages == ()
    answer = rewind_answer(again, [], True)
    assert answer["file_count"] == 0 and answer["message_count"] == 0


def test_a_rewind_takes_back_the_approvals_of_what_it_removed(store: SessionStore) -> None:
    session_id = store.create()
    with store.acquire_writer_lease(session_id) as lease:
        _turn(lease, "t1", "first", "one")
        lease.append({"type": "user", "turn_id": "t2", "text": "second"})
        asked = {"type": "approval", "turn_id": "t2", "approval_id": "a1", "kind": "command"}
        lease.append({**asked, "decision": "pending"})
        lease.append({**asked, "decision": "allow_once", "by": "ed#1"})
        lease.append(
            {"type": "terminal", "turn_id": "t2", "status": "completed", "assistant_text": ""}
        )
    history = store.history(session_id, None)
    assert history is not None
    assert "approval" in [item.body["kind"] for item in history.items]
    cursor = str(_items(store, session_id)[2]["cursor"])
    with store.acquire_writer_lease(session_id) as lease:
        commit_rewind(store, lease, cursor, True, False)
    history = store.history(session_id, None)
    assert history is not None
    assert [item.body["kind"] for item in history.items] == ["message", "message", "terminal"]


def test_a_rewind_takes_back_the_tool_calls_of_the_transcript(store: SessionStore) -> None:
    session_id = store.create()
    with store.acquire_writer_lease(session_id) as lease:
        for turn_id, prompt in (("t1", "first"), ("t2", "second")):
            lease.append({"type": "user", "turn_id": turn_id, "text": prompt})
            call = {"turn_id": turn_id, "call_id": f"c-{turn_id}", "name": "read_file"}
            lease.append({"type": "tool_call", **call, "arguments": '{"path": "a"}'})
            lease.append({"type": "tool_result", **call, "output": "x", "is_error": False})
            lease.append(
                {
                    "type": "terminal",
                    "turn_id": turn_id,
                    "status": "completed",
                    "assistant_text": "",
                }
            )

    def calls() -> list[str]:
        conversation = store.transcript(session_id).conversation()
        return [entry[0].call_id for entry in conversation if isinstance(entry, tuple)]

    assert calls() == ["c-t1", "c-t2"]
    cursor = str(_items(store, session_id)[1]["cursor"])  # the end of t1
    with store.acquire_writer_lease(session_id) as lease:
        commit_rewind(store, lease, cursor, True, False)
    assert calls() == ["c-t1"]
