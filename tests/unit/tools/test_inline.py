"""Read-only file tools on the event loop: where steps run, and what counts as local."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.mounts import mount, use_mountinfo

from magi_code.storage import mounts
from magi_code.tools import files as files_module
from magi_code.tools import inline
from magi_code.tools.base import CALL_BATCH, CallBatch, ToolContext, ToolInputError
from magi_code.tools.files import ListFiles, ReadFile, _list_files, _read_file
from magi_code.tools.inline import (
    CHECKPOINT,
    MAX_ANSWERS,
    MAY_BLOCK,
    DirectoryListings,
    Entry,
    Marker,
    ProjectFiles,
    Steps,
    finish,
    resolve_steps,
    run_steps,
    scan_project,
    walk,
)
from magi_code.tools.paths import resolve_in_project


def threads_of(seen: list[int]) -> Steps[list[int]]:
    seen.append(threading.get_ident())
    yield CHECKPOINT
    seen.append(threading.get_ident())
    yield MAY_BLOCK
    seen.append(threading.get_ident())
    yield CHECKPOINT
    seen.append(threading.get_ident())
    return seen


async def test_steps_run_on_the_loop_until_one_may_block() -> None:
    here = threading.get_ident()
    seen = await run_steps(threads_of([]), inline=True)
    assert seen[:2] == [here, here]
    assert here not in seen[2:] and len(set(seen[2:])) == 1


async def test_steps_not_inline_run_in_a_worker_thread_from_the_start() -> None:
    seen = await run_steps(threads_of([]), inline=False)
    assert threading.get_ident() not in seen


async def test_a_slice_that_ran_its_time_hands_the_rest_to_a_thread() -> None:
    def slow(seen: list[int]) -> Steps[list[int]]:
        seen.append(threading.get_ident())
        time.sleep(inline.INLINE_SLICE_SECONDS * 2)
        yield CHECKPOINT
        seen.append(threading.get_ident())
        return seen

    first, second = await run_steps(slow([]), inline=True)
    assert first == threading.get_ident() != second


@pytest.mark.parametrize("on_loop", [True, False])
async def test_what_steps_raise_is_raised(on_loop: bool) -> None:
    def failing() -> Steps[None]:
        yield CHECKPOINT
        raise ToolInputError("no")

    with pytest.raises(ToolInputError, match="no"):
        await run_steps(failing(), inline=on_loop)


# -- what is local -------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "my project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("a\n")
    return root.resolve()


@pytest.mark.parametrize(
    ("kind", "local"),
    [("ext4", True), ("tmpfs", True), ("nfs4", False), ("fuse.sshfs", False), ("9p", False)],
)
def test_the_root_is_local_by_the_type_of_the_mount_it_is_on(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch, kind: str, local: bool
) -> None:
    lines = [mount("/", "ext4", 1), mount(str(project), kind, 2)]
    use_mountinfo(tmp_path, [*lines, mount(f"{project}/src", "nfs", 3)], monkeypatch)
    files = scan_project(project)
    assert files.root == project and files.inline is local
    assert files.mounts == {f"{project}/src"}


def test_without_mountinfo_nothing_is_local(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mounts, "MOUNTINFO", str(tmp_path / "absent"))
    assert scan_project(project).inline is False


def test_a_missing_project_is_the_tools_input_error(tmp_path: Path) -> None:
    with pytest.raises(ToolInputError, match="not available"):
        scan_project(tmp_path / "gone")


# -- steps that may block --------------------------------------------------------------------


def markers_and_result(steps: Steps[object]) -> tuple[list[Marker], object]:
    seen: list[Marker] = []
    while True:
        try:
            seen.append(next(steps))
        except StopIteration as done:
            return seen, done.value


def local(root: Path, mounts: frozenset[str] = frozenset()) -> ProjectFiles:
    return ProjectFiles(root, True, mounts)


def test_a_plain_path_resolves_without_blocking(project: Path) -> None:
    for raw in ("src/a.py", "src/", ".", f"{project}/src", "src/missing/deeper"):
        seen, path = markers_and_result(resolve_steps(local(project), raw))
        assert MAY_BLOCK not in seen, raw
        assert path == resolve_in_project(project, raw), raw


def test_a_link_a_parent_step_or_a_mount_on_the_way_may_block(
    project: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (project / "out").symlink_to(outside)
    (project / "in").symlink_to(project / "src")
    cases = {"in/a.py": None, "src/../src/a.py": None, "/etc": "outside", "out": "outside"}
    for raw, refused in cases.items():
        steps = resolve_steps(local(project), raw)
        if refused:
            with pytest.raises(ToolInputError, match=refused):
                markers_and_result(steps)
            continue
        seen, path = markers_and_result(steps)
        assert seen == [MAY_BLOCK], raw
        assert path == resolve_in_project(project, raw)
    mounted = local(project, frozenset({f"{project}/src"}))
    assert markers_and_result(resolve_steps(mounted, "src/a.py"))[0] == [MAY_BLOCK]


def entries(steps: Iterator[list[Entry] | Marker]) -> tuple[list[Marker], list[Entry]]:
    marks: list[Marker] = []
    items: list[Entry] = []
    for item in steps:
        if isinstance(item, Marker):
            marks.append(item)
        else:
            assert 0 < len(item) <= inline.WALK_STEP_ENTRIES
            items += item
    return marks, items


def test_the_walk_may_block_before_a_link_or_a_mount_and_lists_the_same(project: Path) -> None:
    (project / "src" / "sub").mkdir()
    (project / "src" / "sub" / "b.py").write_text("b\n")
    marks, plain = entries(walk(local(project), project))
    assert MAY_BLOCK not in marks and CHECKPOINT in marks
    assert plain == [("src", True), ("src/sub", True), ("src/a.py", False), ("src/sub/b.py", False)]
    marks, items = entries(walk(local(project, frozenset({f"{project}/src/sub"})), project))
    assert MAY_BLOCK in marks and items == plain
    (project / "link").symlink_to(project / "src")
    marks, items = entries(walk(local(project), project))
    assert MAY_BLOCK in marks
    assert ("link", True) in items and "link/a.py" not in {i[0] for i in items}


# -- directories read once a turn -------------------------------------------------------------

# More than a scheduler tick: a change after this gets other directory times.
TICK_SECONDS = 0.05


def remembering(root: Path) -> ProjectFiles:
    """Files whose listings are kept at once, without the racy window (the tests' trees
    are new)."""
    return ProjectFiles(root, True, frozenset(), listings=DirectoryListings(racy_window_ns=0))


def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    read: list[str] = []
    real = os.scandir

    def counting(path: str) -> object:
        read.append(str(path))
        return real(path)

    monkeypatch.setattr(inline.os, "scandir", counting)
    return read


def listed(files: ProjectFiles) -> list[Entry]:
    return entries(walk(files, files.root))[1]


def test_an_unchanged_directory_is_listed_without_reading_it_again(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = remembering(project)
    first = listed(files)
    time.sleep(TICK_SECONDS)
    read = counted_reads(monkeypatch)
    assert listed(files) == first == [("src", True), ("src/a.py", False)]
    # From another base, and back: a kept listing under each base's prefix.
    assert entries(walk(files, project / "src"))[1] == [("a.py", False)]
    assert listed(files) == first
    assert read == []
    # Another turn's files remember nothing.
    assert listed(remembering(project)) == first and len(read) == 2


@pytest.mark.parametrize(
    "change",
    [
        lambda src: (src / "new.py").write_text("n\n"),
        lambda src: (src / "a.py").unlink(),
        lambda src: (src / "a.py").rename(src / "b.py"),
        lambda src: (src / "a.py").unlink() or (src / "a.py").mkdir(),
        lambda src: (src / "deeper").mkdir(),
    ],
    ids=["created", "removed", "renamed", "file-became-directory", "new-directory"],
)
def test_a_directory_changed_since_it_was_read_is_read_again(
    project: Path, change: Callable[[Path], object]
) -> None:
    files = remembering(project)
    listed(files)
    time.sleep(TICK_SECONDS)
    change(project / "src")
    assert listed(files) == listed(local(project))


def test_within_a_batch_a_listing_checked_since_it_began_stands(project: Path) -> None:
    """The calls of one batch run at the same time: each may see the directory as it was
    when another of them checked it. The next batch, or a call in none, checks again."""
    files = remembering(project)
    before = listed(files)
    time.sleep(TICK_SECONDS)
    token = CALL_BATCH.set(CallBatch())
    try:
        assert listed(files) == before  # checked here, in the batch
        (project / "src" / "new.py").write_text("n\n")
        assert listed(files) == before
    finally:
        CALL_BATCH.reset(token)
    after = [*before, ("src/new.py", False)]
    assert listed(files) == after
    time.sleep(TICK_SECONDS)
    token = CALL_BATCH.set(CallBatch())
    try:
        assert listed(files) == after
        (project / "src" / "new.py").unlink()
        assert listed(files) == after
    finally:
        CALL_BATCH.reset(token)
    token = CALL_BATCH.set(CallBatch())
    try:
        assert listed(files) == before
    finally:
        CALL_BATCH.reset(token)


def test_a_listing_read_in_a_batch_stands_for_the_rest_of_it(project: Path) -> None:
    files = remembering(project)
    token = CALL_BATCH.set(CallBatch())
    try:
        before = listed(files)
        time.sleep(TICK_SECONDS)
        (project / "src" / "a.py").unlink()
        assert listed(files) == before
    finally:
        CALL_BATCH.reset(token)
    assert listed(files) == [("src", True)]


def test_a_directory_replaced_by_another_is_read_again(project: Path) -> None:
    files = remembering(project)
    listed(files)
    (project / "src").rename(project / "old")
    (project / "src").mkdir()
    (project / "src" / "other.py").write_text("o\n")
    assert listed(files) == [
        ("old", True),
        ("src", True),
        ("old/a.py", False),
        ("src/other.py", False),
    ]


# -- list_files answers again from the same listings --------------------------------------


def list_answer(files: ProjectFiles, pattern: str = "**/*.py") -> str:
    return finish(_list_files(files, ".", pattern))


def counted_matching(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []
    real = files_module.glob_regex

    def counting(pattern: str) -> re.Pattern[str]:
        asked.append(pattern)
        return real(pattern)

    monkeypatch.setattr(files_module, "glob_regex", counting)
    return asked


def test_list_files_answers_again_without_matching_while_its_listings_stand(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "src" / "b.txt").write_text("b\n")
    files = remembering(project)
    first = list_answer(files)
    assert first == "src/a.py"
    time.sleep(TICK_SECONDS)
    asked = counted_matching(monkeypatch)
    assert list_answer(files) == first
    assert asked == []
    # Another pattern, or another base with the same pattern, is matched anew.
    assert list_answer(files, "**/*.txt") == "src/b.txt"
    assert finish(_list_files(files, "src", "**/*.py")) == "a.py"
    assert asked == ["**/*.txt", "**/*.py"]


@pytest.mark.parametrize(
    "change",
    [
        lambda src: (src / "new.py").write_text("n\n"),
        lambda src: (src / "a.py").unlink(),
        lambda src: (src / "a.py").rename(src / "b.py"),
        lambda src: (src / "deeper").mkdir() or (src / "deeper" / "c.py").write_text("c\n"),
    ],
    ids=["created", "removed", "renamed", "new-directory"],
)
def test_list_files_answers_anew_once_a_directory_changed(
    project: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[Path], object]
) -> None:
    files = remembering(project)
    list_answer(files)
    time.sleep(TICK_SECONDS)
    change(project / "src")
    asked = counted_matching(monkeypatch)
    assert list_answer(files) == list_answer(local(project))
    assert asked == ["**/*.py", "**/*.py"]


def test_within_a_batch_one_check_of_an_answer_stands_for_the_others(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = remembering(project)
    list_answer(files)
    time.sleep(TICK_SECONDS)
    checked: list[str] = []
    real = DirectoryListings.walked

    def counting(self: DirectoryListings, path: str, prefix: str) -> object:
        checked.append(path)
        return real(self, path, prefix)

    monkeypatch.setattr(DirectoryListings, "walked", counting)
    token = CALL_BATCH.set(CallBatch())
    try:
        first = list_answer(files)
        assert len(checked) == 2  # the root and src
        (project / "src" / "new.py").write_text("n\n")
        assert list_answer(files) == first  # as of the batch's check
        assert len(checked) == 2
    finally:
        CALL_BATCH.reset(token)
    token = CALL_BATCH.set(CallBatch())
    try:
        assert list_answer(files) == "src/a.py\nsrc/new.py"
    finally:
        CALL_BATCH.reset(token)


def test_list_files_answers_anew_once_a_directory_deeper_down_changed(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "src" / "deeper").mkdir()
    (project / "src" / "deeper" / "c.py").write_text("c\n")
    files = remembering(project)
    list_answer(files)
    time.sleep(TICK_SECONDS)
    (project / "src" / "deeper" / "d.py").write_text("d\n")
    asked = counted_matching(monkeypatch)
    assert list_answer(files) == "src/a.py\nsrc/deeper/c.py\nsrc/deeper/d.py"
    assert asked == ["**/*.py"]


def test_list_files_keeps_a_bounded_number_of_small_answers(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = remembering(project)
    patterns = [f"**/{n}*" for n in range(MAX_ANSWERS + 1)]
    for pattern in patterns:
        list_answer(files, pattern)
    asked = counted_matching(monkeypatch)
    list_answer(files, patterns[-1])
    list_answer(files, patterns[0])  # the oldest went
    assert asked == [patterns[0]]
    monkeypatch.setattr(inline, "MAX_ANSWER_ENTRIES", 1)  # this walk sees two entries
    list_answer(files, "**/*.txt")
    list_answer(files, "**/*.txt")
    assert asked == [patterns[0], "**/*.txt", "**/*.txt"]


def test_recent_directories_and_directories_with_links_are_read_every_time(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = local(project)  # the default racy window: this tree was written just now
    listed(fresh)
    (project / "link").symlink_to(project / "src")
    files = remembering(project)
    listed(files)
    time.sleep(TICK_SECONDS)
    read = counted_reads(monkeypatch)
    listed(fresh)
    assert read.count(str(project / "src")) == 1
    marks, items = entries(walk(files, files.root))
    assert MAY_BLOCK in marks and ("link", True) in items
    assert read.count(str(project)) == 2  # the root holds the link; src/ was kept
    assert read.count(str(project / "src")) == 1


def test_a_turn_keeps_a_bounded_number_of_names(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inline, "MAX_LISTED_NAMES", 1)
    for name in ("b", "c"):
        (project / name).mkdir()
    files = remembering(project)
    listed(files)
    time.sleep(TICK_SECONDS)
    read = counted_reads(monkeypatch)
    listed(files)
    # The root (3 names) went over the bound: the directories after it were not kept.
    assert read == [str(project / name) for name in ("b", "c", "src")]


# -- the tools -------------------------------------------------------------------------------


def scandir_threads(monkeypatch: pytest.MonkeyPatch, under: Path) -> list[int]:
    seen: list[int] = []
    real = os.scandir

    def recording(path: str) -> object:
        if str(path).startswith(str(under)):
            seen.append(threading.get_ident())
        return real(path)

    monkeypatch.setattr(inline.os, "scandir", recording)
    return seen


@pytest.mark.parametrize("kind", ["ext4", "nfs4"])
async def test_list_files_runs_on_the_loop_only_on_a_local_filesystem(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    use_mountinfo(tmp_path, [mount("/", kind, 1)], monkeypatch)
    seen = scandir_threads(monkeypatch, project)
    ctx = ToolContext(project_dir=project)
    outcome = await ListFiles().run({"pattern": "**/*.py"}, ctx)
    assert outcome.output == "src/a.py"
    loop_thread = threading.get_ident()
    assert seen
    if kind == "ext4":
        assert set(seen) == {loop_thread}
    else:
        assert loop_thread not in seen
    assert set(ctx.file_scans) == {project}  # scanned once for the turn


async def test_read_file_through_a_link_reads_its_target_in_a_thread(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_mountinfo(tmp_path, [mount("/", "ext4", 1)], monkeypatch)
    (project / "alias.py").symlink_to(project / "src" / "a.py")
    ctx = ToolContext(project_dir=project)
    await inline.project_files(ctx)  # the turn's scan (in a thread) is done
    loop_thread = threading.get_ident()
    opened: list[int] = []
    real = inline.os.lstat

    def recording(path: str) -> os.stat_result:
        opened.append(threading.get_ident())
        return real(path)

    monkeypatch.setattr(inline.os, "lstat", recording)
    assert (await ReadFile().run({"path": "alias.py"}, ctx)).output == "a\n"
    # The link was seen on the loop, and followed (realpath) in a worker thread.
    assert opened[0] == loop_thread and set(opened) - {loop_thread}
    assert (await asyncio.to_thread(finish, resolve_steps(local(project), "alias.py"))) == (
        project / "src" / "a.py"
    )


def test_stacked_mounts_take_the_one_on_top(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [mount("/", "ext4", 1), mount(str(project), "ext4", 2)]
    lines.append(mount(str(project), "fuse.sshfs", 3))
    use_mountinfo(tmp_path, lines, monkeypatch)
    assert scan_project(project).inline is False
    use_mountinfo(tmp_path, [lines[0], lines[2], lines[1]], monkeypatch)
    assert scan_project(project).inline is True


def test_a_double_slash_path_under_the_filesystem_root_resolves_the_full_way() -> None:
    seen, path = markers_and_result(resolve_steps(local(Path("/")), "//etc"))
    assert seen == [MAY_BLOCK]
    assert path == resolve_in_project(Path("/"), "//etc") == Path("/etc")


def test_long_reads_and_large_directories_reach_checkpoints(project: Path) -> None:
    # The slice ends at a checkpoint: a step between two must stay short.
    (project / "long.txt").write_text("line\n" * 5000)
    files = local(project)
    seen, text = markers_and_result(_read_file(files, "long.txt", 10**9, 10))
    assert seen.count(CHECKPOINT) >= 4 and "offset 1000000000 is past the end" in str(text)
    crowded = project / "crowded"
    crowded.mkdir()
    for i in range(inline.WALK_STEP_ENTRIES * 2):
        (crowded / f"f{i:05}").touch()
    marks, items = entries(walk(files, crowded))
    assert marks.count(CHECKPOINT) >= 4 and len(items) == inline.WALK_STEP_ENTRIES * 2


async def test_a_mount_or_unmount_makes_the_next_call_scan_again(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generation = [0]
    scans: list[int] = []
    real = inline.scan_project

    def counting(project_dir: Path, at: int = 0) -> ProjectFiles:
        scans.append(at)
        return real(project_dir, at)

    monkeypatch.setattr(mounts.MOUNT_TABLE, "generation", lambda: generation[0])
    monkeypatch.setattr(inline, "scan_project", counting)
    ctx = ToolContext(project_dir=project)
    await inline.project_files(ctx)
    await inline.project_files(ctx)
    generation[0] = 1
    assert (await inline.project_files(ctx)).generation == 1
    assert scans == [0, 1]


async def test_the_mount_table_is_polled_once_per_batch(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generation = [0]
    polls: list[int] = []

    def polled() -> int:
        polls.append(generation[0])
        return generation[0]

    monkeypatch.setattr(mounts.MOUNT_TABLE, "generation", polled)
    ctx = ToolContext(project_dir=project)
    token = CALL_BATCH.set(CallBatch())
    try:
        await inline.project_files(ctx)
        generation[0] = 1  # during the batch: its calls may all have run before
        assert (await inline.project_files(ctx)).generation == 0
    finally:
        CALL_BATCH.reset(token)
    assert polls == [0]
    token = CALL_BATCH.set(CallBatch())
    try:
        assert (await inline.project_files(ctx)).generation == 1
    finally:
        CALL_BATCH.reset(token)
    assert (await inline.project_files(ctx)).generation == 1
    assert polls == [0, 1, 1]


async def test_calls_that_start_together_share_one_scan(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scans: list[int] = []
    real = inline.scan_project

    def counting(project_dir: Path, at: int = 0) -> ProjectFiles:
        scans.append(at)
        time.sleep(0.05)  # long enough for every call to be waiting on it
        return real(project_dir, at)

    monkeypatch.setattr(inline, "scan_project", counting)
    ctx = ToolContext(project_dir=project)
    found = await asyncio.gather(*(inline.project_files(ctx) for _ in range(8)))
    assert len(scans) == 1 and all(files is found[0] for files in found)
