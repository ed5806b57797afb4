"""The ``session.list`` index (``listing.SessionIndex``) on real directories: every page
it serves equals the page a full scan of the directory gives at that moment, through
random creates, deletes, renames, planted files and changes inside sessions, and with
sessions created or deleted by another process between pages.

An index is only reused once the directory's timestamps are ``RACY_NS`` old, so the
tests that exercise reuse let the directory settle (``settle``) before the page that
builds the index, and count scans to show that later pages did not rescan.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from unittest import mock

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from magi_code.sessions import listing
from magi_code.sessions.listing import SessionIndex, list_sessions
from magi_code.sessions.store import HISTORY, META, SessionStore

REPO = Path(__file__).resolve().parents[3]


def settle() -> None:
    """Let the directory's timestamps age past the racy window."""
    time.sleep(listing.RACY_NS / 1e9 + 0.02)


def page_both(
    store: SessionStore, after: str | None, limit: int
) -> tuple[dict[str, object], dict[str, object]]:
    """The store's page (shared index) and a full scan's page (fresh index)."""
    indexed = store.list_sessions(after, limit)
    scanned = list_sessions(store._root, after, limit)
    return indexed, scanned


def walk(store: SessionStore, limit: int) -> list[dict[str, object]]:
    pages = []
    after = None
    for _ in range(1000):
        indexed, scanned = page_both(store, after, limit)
        assert indexed == scanned, (after, indexed, scanned)
        pages.append(indexed)
        if not indexed["truncated"]:
            return pages
        after = indexed["next_after"]  # type: ignore[assignment]
    raise AssertionError("listing did not end")


def ids(pages: list[dict[str, object]]) -> list[str]:
    return [s["session_id"] for p in pages for s in p["sessions"]]  # type: ignore[attr-defined]


def test_pages_of_an_unchanged_directory_are_served_without_rescanning(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions")
    created = sorted(store.create() for _ in range(40))
    settle()
    index = store._index
    pages = walk(store, 7)
    assert ids(pages) == created
    assert index.scans == 1  # one scan for six pages
    assert walk(store, 7) == pages and index.scans == 1


def test_a_scan_within_the_racy_window_is_not_reused(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions")
    store.create()
    index = store._index
    store.list_sessions(None, 32)
    store.list_sessions(None, 32)
    # The directory changed just now: the same key could still hide a later change.
    assert index.scans == 2
    settle()
    store.list_sessions(None, 32)
    store.list_sessions(None, 32)
    assert index.scans == 3


def directory_stat(mtime_ns: int, ctime_ns: int) -> os.stat_result:
    # mode, ino, dev, nlink, uid, gid, size, 3 x int times, 3 x float times, 3 x ns times
    return os.stat_result(
        (0o40700, 1, 1, 2, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0, mtime_ns, ctime_ns)
    )


def test_settled_timestamps() -> None:
    now = time.time_ns()
    assert listing._settled(directory_stat(now - 10**9 + 7, now - 10**9 + 7), now)
    assert not listing._settled(directory_stat(now - 10**6, now - 10**6), now)
    assert not listing._settled(directory_stat(now - 10**9, now - 10**6), now)  # ctime counts
    # Whole-second timestamps (a coarse filesystem): one second old is not enough.
    whole = (now // 10**9 - 1) * 10**9
    assert not listing._settled(directory_stat(whole, whole), whole + 10**9 + 7)
    assert listing._settled(directory_stat(whole, whole), whole + 3 * 10**9)


# Operations on the sessions directory, run between pages.
VALID = st.text("abcdefghjkmnpqrstvwxyz0123456789", min_size=3, max_size=6).map(
    lambda s: f"ses_{s}"
)
OPS = st.one_of(
    st.tuples(st.just("create")),
    st.tuples(st.just("mkdir"), VALID),  # a directory with no history
    st.tuples(st.just("delete"), st.integers(0, 63)),
    st.tuples(st.just("rename"), st.integers(0, 63), VALID),
    st.tuples(st.just("hide"), st.integers(0, 63)),  # rename to a name that is no ID
    st.tuples(st.just("plant"), VALID, st.sampled_from(["file", "fifo", "symlink"])),
    st.tuples(st.just("lose_history"), st.integers(0, 63)),  # inside: root unchanged
    st.tuples(st.just("title"), st.integers(0, 63), st.text(max_size=20)),
    st.tuples(st.just("settle")),
    st.tuples(st.just("page"), st.integers(1, 5)),
)


def sessions_in(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())


def apply(store: SessionStore, op: tuple[object, ...]) -> None:
    root = store._root
    existing = sessions_in(root)
    kind = op[0]
    pick = None
    if existing and len(op) > 1 and isinstance(op[1], int):
        pick = existing[op[1] % len(existing)]
    if kind == "create":
        store.create()
    elif kind == "mkdir" and not os.path.lexists(root / str(op[1])):
        (root / str(op[1])).mkdir()
    elif kind == "delete" and pick is not None:
        shutil.rmtree(pick)
    elif kind == "rename" and pick is not None and not os.path.lexists(root / str(op[2])):
        pick.rename(root / str(op[2]))
    elif kind == "hide" and pick is not None:
        pick.rename(root / f".trash-{pick.name}")
    elif kind == "plant" and not os.path.lexists(root / str(op[1])):
        target = root / str(op[1])
        if op[2] == "file":
            target.write_bytes(b"{}")
        elif op[2] == "fifo":
            os.mkfifo(target)
        elif existing:
            target.symlink_to(existing[0])
    elif kind == "lose_history" and pick is not None:
        (pick / HISTORY).unlink(missing_ok=True)
    elif kind == "title" and pick is not None:
        (pick / META).write_bytes(orjson.dumps({"v": 1, "title": op[2]}))
    elif kind == "settle":
        settle()


@settings(
    max_examples=12,
    # (This list replaces the profile's: it names ``too_slow`` again.)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(OPS, min_size=1, max_size=14), st.integers(1, 8))
def test_indexed_pages_equal_full_scans_through_random_changes(
    ops: list[tuple[object, ...]], limit: int
) -> None:
    # The window need only exceed how far a directory's timestamps lag the clock (one
    # kernel tick, at most 10 ms): a shorter one lets each ``settle`` cost 50 ms, not 120.
    with mock.patch.object(listing, "RACY_NS", 30_000_000), tempfile.TemporaryDirectory() as tmp:
        store = SessionStore(Path(tmp) / "sessions")
        for _ in range(6):
            store.create()
        settle()
        walk(store, limit)  # a reusable index exists before the first change
        after: str | None = None
        for op in ops:
            if op[0] == "page":
                # A client part way through a listing asks for its next pages.
                for _ in range(int(op[1])):  # type: ignore[call-overload]
                    indexed, scanned = page_both(store, after, limit)
                    assert indexed == scanned, (op, after, indexed, scanned)
                    after = indexed["next_after"] if indexed["truncated"] else None  # type: ignore[assignment]
            else:
                apply(store, op)
        walk(store, limit)


_OTHER_PROCESS = textwrap.dedent(
    """
    import shutil, sys
    from pathlib import Path
    from magi_code.sessions.store import SessionStore

    root = Path(sys.argv[1])
    store = SessionStore(root)
    for _ in range(int(sys.argv[2])):
        print(store.create())
    for name in sys.argv[3:]:
        shutil.rmtree(root / name)
    """
)


def other_process(root: Path, creates: int, deletes: list[str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS, str(root), str(creates), *deletes],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.split()


def test_sessions_another_process_creates_or_deletes_between_pages_are_seen(
    tmp_path: Path,
) -> None:
    store = SessionStore(tmp_path / "sessions")
    mine = sorted(store.create() for _ in range(30))
    settle()
    index = store._index
    first, _ = page_both(store, None, 8)
    second, _ = page_both(store, first["next_after"], 8)  # type: ignore[arg-type]
    assert index.scans == 1
    listed = ids([first, second])
    # Another service on this MC_HOME creates sessions (they sort last: IDs are
    # time-ordered) and deletes one this listing has not reached yet.
    gone = mine[20]
    theirs = other_process(store._root, 5, [gone])
    after = second["next_after"]
    while True:
        indexed, scanned = page_both(store, after, 8)  # type: ignore[arg-type]
        assert indexed == scanned
        listed += ids([indexed])
        if not indexed["truncated"]:
            break
        after = indexed["next_after"]
    assert index.scans >= 2  # the change was noticed
    assert gone not in listed
    assert listed == sorted(set(mine) - {gone} | set(theirs))
    assert all(p["incomplete"] is False for p in [first, second, indexed])


def test_an_index_entry_whose_session_was_deleted_is_never_listed(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions")
    created = sorted(store.create() for _ in range(5))
    settle()
    assert ids(walk(store, 32)) == created
    shutil.rmtree(store._root / created[2])  # the root directory changes: rescan
    page = store.list_sessions(None, 32)
    assert ids([page]) == created[:2] + created[3:]
    assert page["incomplete"] is False
    # The history alone vanishing leaves the root untouched: the entry stays a candidate
    # and is left out and flagged, exactly as a full scan does.
    settle()
    walk(store, 32)
    (store._root / created[0] / HISTORY).unlink()
    indexed, scanned = page_both(store, None, 32)
    assert indexed == scanned
    assert ids([indexed]) == created[1:2] + created[3:]
    assert indexed["incomplete"] is True


def test_an_index_is_per_directory(tmp_path: Path) -> None:
    """One index serving another directory (or a replaced one) never reuses entries."""
    index = SessionIndex()
    a = SessionStore(tmp_path / "a")
    b = SessionStore(tmp_path / "b")
    in_a = a.create()
    in_b = b.create()
    settle()
    assert ids([list_sessions(a._root, None, 32, index)]) == [in_a]
    assert ids([list_sessions(b._root, None, 32, index)]) == [in_b]
    # The directory replaced by another one at the same path.
    os.rename(a._root, tmp_path / "old-a")
    os.rename(b._root, a._root)
    assert ids([list_sessions(a._root, None, 32, index)]) == [in_b]
