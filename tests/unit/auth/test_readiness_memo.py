"""``ReadinessMemo``: ``status.provider_auth_ready`` from memory only while nothing changed.

Every test runs the real readiness check (``magi_code.composition.provider_auth_ready``:
settings files, the auth store, the environment) on real files; the check is only wrapped
to count how often it really ran. Most tests use a zero racy window so that a file
written a moment ago can be vouched for by its stamp, which is what they exercise; the
racy window itself has its own tests.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from magi_code.auth.readiness import ReadinessMemo
from magi_code.auth.store import AuthStore
from magi_code.composition import provider_auth_ready
from magi_code.protocol.errors import ServiceError
from magi_code.storage.files import atomic_write
from magi_code.storage.launch import LaunchContext

# Two global settings documents of exactly the same size: the first selects a custom
# provider without auth (ready), the second one that is not defined (not ready).
READY = {"provider": "pa", "providers": {"pa": {"api": "openai-chat", "base_url": "http://x"}}}
NOT_READY = {**READY, "provider": "pb"}
OLD_NS = 1_600_000_000 * 10**9


class Counting:
    """The real check, counting its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, ctx: LaunchContext) -> bool:
        self.runs += 1
        return provider_auth_ready(ctx)


@pytest.fixture
def ctx(home: Path, tmp_path: Path) -> LaunchContext:
    project = tmp_path / "project"
    project.mkdir()
    return LaunchContext(home, project, {"PATH": "/usr/bin"})


def _memo(check: Counting, **kwargs: int) -> ReadinessMemo:
    return ReadinessMemo(check, racy_window_ns=kwargs.get("racy_window_ns", 0))


def _write_settings(ctx: LaunchContext, document: dict[str, object]) -> None:
    ctx.global_settings_path.write_bytes(json.dumps(document).encode())


def _tick() -> None:
    # Lets a coarse file-system clock (one scheduler tick) move on between two writes.
    time.sleep(0.02)


def test_unchanged_files_are_not_read_again(ctx: LaunchContext) -> None:
    _write_settings(ctx, READY)
    check = Counting()
    memo = _memo(check)
    assert memo.cached(ctx) is None
    assert memo.compute(ctx) is True
    for _ in range(5):
        assert memo.cached(ctx) is True
    assert check.runs == 1


def test_a_missing_home_and_project_file_are_remembered_as_absent(ctx: LaunchContext) -> None:
    check = Counting()
    memo = _memo(check)
    assert memo.answer(ctx) is False  # built-in anthropic, no key anywhere
    assert memo.cached(ctx) is False
    assert check.runs == 1


def test_same_size_rewrite_in_place_with_the_same_mtime_is_seen(ctx: LaunchContext) -> None:
    path = ctx.global_settings_path
    _write_settings(ctx, READY)
    os.utime(path, ns=(OLD_NS, OLD_NS))
    check = Counting()
    memo = _memo(check)
    assert memo.answer(ctx) is True
    assert memo.cached(ctx) is True
    before = os.stat(path)
    _tick()
    data = json.dumps(NOT_READY).encode()
    assert len(data) == before.st_size
    with open(path, "r+b") as fh:  # in place: same inode
        fh.write(data)
    os.utime(path, ns=(OLD_NS, OLD_NS))  # and the modification time put back
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    assert after.st_ctime_ns != before.st_ctime_ns  # only the status-change time moved
    assert memo.cached(ctx) is None
    assert memo.answer(ctx) is False
    assert check.runs == 2


def test_same_size_rewrite_in_place_within_the_same_second_is_seen(ctx: LaunchContext) -> None:
    _write_settings(ctx, READY)
    check = Counting()
    memo = _memo(check)
    assert memo.answer(ctx) is True
    _tick()
    _write_settings(ctx, NOT_READY)  # truncate and write: same inode, same size
    assert memo.cached(ctx) is None
    assert memo.answer(ctx) is False
    assert memo.cached(ctx) is False


def test_a_replacement_by_rename_is_seen(ctx: LaunchContext) -> None:
    _write_settings(ctx, READY)
    check = Counting()
    memo = _memo(check)
    assert memo.answer(ctx) is True
    inode = os.stat(ctx.global_settings_path).st_ino
    atomic_write(ctx.global_settings_path, json.dumps(NOT_READY).encode())
    assert os.stat(ctx.global_settings_path).st_ino != inode
    assert memo.cached(ctx) is None
    assert memo.answer(ctx) is False


def test_a_deleted_settings_file_is_seen(ctx: LaunchContext) -> None:
    _write_settings(ctx, READY)
    check = Counting()
    memo = _memo(check)
    assert memo.answer(ctx) is True
    ctx.global_settings_path.unlink()
    assert memo.cached(ctx) is None
    assert memo.answer(ctx) is False  # the built-in default without a key


def test_a_project_settings_file_that_appears_is_seen(ctx: LaunchContext) -> None:
    _write_settings(ctx, {**READY, "provider": "anthropic"})
    check = Counting()
    memo = _memo(check)
    assert memo.answer(ctx) is False
    ctx.project_settings_path.parent.mkdir()
    ctx.project_settings_path.write_text(json.dumps({"provider": "pa"}))
    assert memo.cached(ctx) is None
    assert memo.answer(ctx) is True


def test_a_login_in_another_process_is_seen(ctx: LaunchContext) -> None:
    check = Counting()
    memo = _memo(check)
    assert memo.answer(ctx) is False
    # What `magi-code login` writes: the store, replaced atomically under its lock.
    AuthStore(ctx.auth_path).commit("anthropic", {"type": "api_key", "key": "sk-x"}, None)
    assert memo.cached(ctx) is None
    assert memo.answer(ctx) is True
    assert AuthStore(ctx.auth_path).remove("anthropic")
    assert memo.cached(ctx) is None
    assert memo.answer(ctx) is False


def test_a_permission_change_on_the_auth_store_is_seen(ctx: LaunchContext) -> None:
    AuthStore(ctx.auth_path).commit("anthropic", {"type": "api_key", "key": "sk-x"}, None)
    check = Counting()
    memo = _memo(check)
    assert memo.answer(ctx) is True
    _tick()
    os.chmod(ctx.auth_path, 0o644)  # the store refuses a file others can read
    assert memo.cached(ctx) is None
    with pytest.raises(ServiceError):
        memo.compute(ctx)


def test_each_environment_gets_its_own_answer(ctx: LaunchContext) -> None:
    with_key = LaunchContext(ctx.mc_home, ctx.project_dir, {**ctx.env, "ANTHROPIC_API_KEY": "k"})
    check = Counting()
    memo = _memo(check)
    assert memo.answer(ctx) is False
    assert memo.answer(with_key) is True
    for _ in range(3):
        assert memo.cached(ctx) is False
        assert memo.cached(with_key) is True
    assert check.runs == 2
    # An equal environment in another context object shares the answer.
    again = LaunchContext(ctx.mc_home, ctx.project_dir, dict(with_key.env))
    assert memo.cached(again) is True


def test_an_access_token_expiry_ends_the_answer(ctx: LaunchContext) -> None:
    expires = int(time.time()) + 3600
    record = {"type": "oauth", "access_token": "a", "refresh_token": None, "expires_at": expires}
    AuthStore(ctx.auth_path).commit("openai-codex", record, None)
    _write_settings(ctx, {"provider": "openai-codex"})
    clock = [time.time()]
    check = Counting()
    memo = ReadinessMemo(check, clock=lambda: clock[0], racy_window_ns=0)
    assert memo.answer(ctx) is True
    assert memo.cached(ctx) is True
    clock[0] = expires - 1
    assert memo.cached(ctx) is True
    clock[0] = expires
    assert memo.cached(ctx) is None  # the token may have expired: compute again
    clock[0] = time.time() - 60  # a clock that moved back: compute again too
    assert memo.cached(ctx) is None


def test_errors_are_never_remembered(ctx: LaunchContext) -> None:
    ctx.global_settings_path.write_text("{not json")
    check = Counting()
    memo = _memo(check)
    for _ in range(3):
        assert memo.cached(ctx) is None
        with pytest.raises(ServiceError):
            memo.compute(ctx)
    assert check.runs == 3


def test_a_file_changed_within_the_racy_window_is_read_every_time(ctx: LaunchContext) -> None:
    _write_settings(ctx, READY)  # just now: its stamp cannot vouch for its content yet
    check = Counting()
    memo = ReadinessMemo(check)  # the default window
    for _ in range(3):
        assert memo.cached(ctx) is None
        assert memo.compute(ctx) is True
    assert check.runs == 3
    # The same stamps, taken once the window has passed, are trusted.
    later = ReadinessMemo(check, clock_ns=lambda: time.time_ns() + 3 * 10**9)
    assert later.compute(ctx) is True
    assert later.cached(ctx) is True


def test_an_unstattable_path_disables_the_memo(ctx: LaunchContext) -> None:
    # A file where the project's settings directory should be: ENOTDIR, not "absent".
    ctx.project_settings_path.parent.write_text("")
    check = Counting()
    memo = _memo(check)
    with pytest.raises(ServiceError):
        memo.compute(ctx)
    assert memo.cached(ctx) is None


def test_a_file_that_appears_and_vanishes_during_the_check_is_not_remembered(
    ctx: LaunchContext,
) -> None:
    # Another process writes the project's settings while the check runs and removes them
    # right after: the answer it produced must not outlive the file.
    ctx.project_settings_path.parent.mkdir()
    _write_settings(ctx, READY)
    project_file = ctx.project_settings_path

    class Transient(Counting):
        def __call__(self, ctx: LaunchContext) -> bool:
            if self.runs == 0:
                _tick()
                project_file.write_text(json.dumps({"provider": "pb"}))  # not ready
                try:
                    return super().__call__(ctx)
                finally:
                    project_file.unlink()
            return super().__call__(ctx)

    check = Transient()
    memo = _memo(check)
    assert memo.compute(ctx) is False  # what the check saw, the file present
    assert memo.cached(ctx) is None  # the directory moved on: compute again
    assert memo.answer(ctx) is True
    assert memo.cached(ctx) is True


def test_a_dangling_symlink_is_never_remembered_and_its_target_is_seen(
    ctx: LaunchContext, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere" / "settings.json"
    target.parent.mkdir()
    ctx.global_settings_path.symlink_to(target)
    check = Counting()
    memo = _memo(check)
    assert memo.answer(ctx) is False  # read through the link: no file, the default
    assert memo.cached(ctx) is None
    target.write_text(json.dumps(READY))
    assert memo.answer(ctx) is True
    _tick()
    target.write_text(json.dumps(NOT_READY))
    assert memo.answer(ctx) is False
    other = tmp_path / "elsewhere" / "other.json"
    other.write_text(json.dumps(READY))
    ctx.global_settings_path.unlink()
    ctx.global_settings_path.symlink_to(other)  # the link pointed elsewhere
    assert memo.answer(ctx) is True
