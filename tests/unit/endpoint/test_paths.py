"""Runtime directory resolution and the private-directory checks, on real directories."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from magi_code.client.handshake import daemon_socket
from magi_code.endpoint.paths import (
    MAX_SOCKET_PATH_BYTES,
    RUNTIME_DIR_ENV,
    SocketPathTooLong,
    UnsafeRuntimeDir,
    ensure_private_dir,
    home_hash,
    runtime_dir,
    runtime_dir_of,
    runtime_paths,
    socket_name_of,
    socket_path,
    state_dir,
    verify_private_dir,
)
from magi_code.storage.launch import LaunchContext

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another uid")


def ctx(mc_home: Path, **env: str) -> LaunchContext:
    return LaunchContext(mc_home=mc_home, project_dir=mc_home.parent, env=env)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def private_base() -> Iterator[Path]:
    """A short private dir: pytest's tmp_path can push the socket path past its budget."""
    base = Path(tempfile.mkdtemp(prefix="xdg-", dir="/tmp"))
    os.chmod(base, 0o700)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short world-reachable directory under /tmp (pytest's tmp_path may be too long)."""
    path = Path(os.path.realpath("/tmp")) / f"mcp-{os.getpid()}"
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


# --- ensure_private_dir / verify_private_dir -------------------------------------------


def test_creates_missing_dirs_with_mode_0700_despite_permissive_umask(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "run"
    old = os.umask(0o000)
    try:
        ensure_private_dir(target)
    finally:
        os.umask(old)
    for path in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert stat.S_ISDIR(os.lstat(path).st_mode)
        assert mode_of(path) == 0o700
        assert os.lstat(path).st_uid == os.geteuid()


def test_existing_private_dir_is_accepted_and_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "run"
    target.mkdir(mode=0o700)
    (target / "keep").write_text("x")
    ensure_private_dir(target)
    assert (target / "keep").read_text() == "x"


def test_refuses_group_or_world_accessible_dir(tmp_path: Path) -> None:
    target = tmp_path / "run"
    target.mkdir()
    os.chmod(target, 0o755)
    with pytest.raises(UnsafeRuntimeDir, match="chmod 700") as info:
        ensure_private_dir(target)
    assert str(target) in str(info.value)
    assert mode_of(target) == 0o755  # never "fixed" silently


def test_refuses_symlink_in_place_of_the_dir(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "run"
    link.symlink_to(real)
    with pytest.raises(UnsafeRuntimeDir, match="symlink"):
        ensure_private_dir(link)
    with pytest.raises(UnsafeRuntimeDir):
        verify_private_dir(link)
    assert link.is_symlink()


def test_refuses_dangling_symlink_instead_of_creating_through_it(tmp_path: Path) -> None:
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeRuntimeDir):
        ensure_private_dir(link)
    assert not (tmp_path / "elsewhere").exists()


def test_refuses_a_regular_file(tmp_path: Path) -> None:
    target = tmp_path / "run"
    target.write_text("")
    with pytest.raises(UnsafeRuntimeDir):
        ensure_private_dir(target)


def test_refuses_parent_writable_by_others_unless_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(UnsafeRuntimeDir, match="writable by others"):
        ensure_private_dir(shared / "run")
    os.chmod(shared, 0o1777)  # like /tmp: others cannot rename our entries
    ensure_private_dir(shared / "run")
    assert mode_of(shared / "run") == 0o700


@root_only
def test_refuses_dir_owned_by_another_user(tmp_path: Path) -> None:
    target = tmp_path / "run"
    target.mkdir(mode=0o700)
    os.chown(target, NOBODY, NOBODY)
    with pytest.raises(UnsafeRuntimeDir, match="owned by uid 65534"):
        ensure_private_dir(target)


@root_only
def test_refuses_parent_owned_by_another_user(tmp_path: Path) -> None:
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, NOBODY, NOBODY)
    with pytest.raises(UnsafeRuntimeDir, match="ancestor"):
        ensure_private_dir(parent / "run")


def test_verify_reports_missing_dir_as_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        verify_private_dir(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()


def test_relative_path_is_refused() -> None:
    with pytest.raises(UnsafeRuntimeDir):
        ensure_private_dir(Path("relative/run"))


# --- runtime_dir ------------------------------------------------------------------------


def test_uses_private_xdg_runtime_dir_with_home_hash(home: Path, private_base: Path) -> None:
    got = runtime_dir(ctx(home, XDG_RUNTIME_DIR=str(private_base)), platform="linux")
    assert got == private_base / "magi-code" / home_hash(home)
    ensure_private_dir(got)
    assert mode_of(private_base / "magi-code") == 0o700


def test_ignores_xdg_runtime_dir_that_is_not_private(home: Path, tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o755)
    got = runtime_dir(ctx(home, XDG_RUNTIME_DIR=str(loose)), platform="linux")
    assert got == state_dir(ctx(home))


@root_only
def test_ignores_xdg_runtime_dir_owned_by_someone_else(home: Path, private_base: Path) -> None:
    os.chown(private_base, NOBODY, NOBODY)
    got = runtime_dir(ctx(home, XDG_RUNTIME_DIR=str(private_base)), platform="linux")
    assert got == home.resolve() / "run"


def test_without_xdg_uses_mc_home_run(home: Path) -> None:
    assert runtime_dir(ctx(home), platform="linux") == home.resolve() / "run"
    assert runtime_dir(ctx(home, XDG_RUNTIME_DIR="relative"), platform="linux") == (
        home.resolve() / "run"
    )


def test_macos_prefers_private_tmpdir(home: Path, private_base: Path) -> None:
    env = {"TMPDIR": str(private_base), "XDG_RUNTIME_DIR": "/nonexistent"}
    got = runtime_dir(LaunchContext(home, home, env), platform="darwin")
    assert got == private_base / "magi-code" / home_hash(home)


def test_long_mc_home_falls_back_to_short_tmp_dir_that_binds(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "mc-home"
    deep.mkdir(parents=True)
    got = runtime_dir(ctx(deep), platform="linux")
    assert got == Path("/tmp") / f"magi-code-{os.geteuid()}" / home_hash(deep)
    sock = socket_path(got)
    assert len(os.fsencode(sock)) <= MAX_SOCKET_PATH_BYTES
    ensure_private_dir(got)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(sock))
            assert stat.S_ISSOCK(os.lstat(sock).st_mode)
    finally:
        shutil.rmtree(got)


def test_long_xdg_runtime_dir_falls_back(home: Path, tmp_path: Path) -> None:
    long_base = tmp_path / ("x" * 90)
    long_base.mkdir(mode=0o700)
    got = runtime_dir(ctx(home, XDG_RUNTIME_DIR=str(long_base)), platform="linux")
    assert not got.is_relative_to(long_base)
    assert len(os.fsencode(socket_path(got))) <= MAX_SOCKET_PATH_BYTES


def test_one_dir_per_resolved_mc_home(tmp_path: Path, private_base: Path) -> None:
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.mkdir()
    b.mkdir()
    alias = tmp_path / "alias"
    alias.symlink_to(a)
    env = {"XDG_RUNTIME_DIR": str(private_base)}
    dir_a = runtime_dir(ctx(a, **env), platform="linux")
    assert runtime_dir(ctx(alias, **env), platform="linux") == dir_a
    assert runtime_dir(ctx(b, **env), platform="linux") != dir_a
    assert runtime_paths(ctx(alias)).lock == runtime_paths(ctx(a)).lock


def test_override_is_used_verbatim(home: Path, short_tmp: Path) -> None:
    chosen = short_tmp / "rt"
    assert runtime_dir(ctx(home, **{RUNTIME_DIR_ENV: str(chosen)})) == chosen


def test_override_must_be_absolute_and_short(home: Path, tmp_path: Path) -> None:
    with pytest.raises(UnsafeRuntimeDir, match=RUNTIME_DIR_ENV):
        runtime_dir(ctx(home, **{RUNTIME_DIR_ENV: "rel/dir"}))
    with pytest.raises(SocketPathTooLong):
        runtime_dir(ctx(home, **{RUNTIME_DIR_ENV: str(tmp_path / ("z" * 100))}))


def test_socket_path_length_boundary() -> None:
    fits = Path("/" + "a" * (MAX_SOCKET_PATH_BYTES - len("/daemon.sock") - 1))
    assert len(os.fsencode(socket_path(fits))) == MAX_SOCKET_PATH_BYTES
    with pytest.raises(SocketPathTooLong):
        socket_path(Path(str(fits) + "b"))


def test_runtime_paths_keep_lock_log_and_info_in_the_state_dir(home: Path) -> None:
    paths = runtime_paths(ctx(home, XDG_RUNTIME_DIR="/nonexistent"), platform="linux")
    assert paths.state_dir == home.resolve() / "run"
    assert paths.lock == paths.state_dir / "daemon.lock"
    assert paths.start_lock == paths.state_dir / "start.lock"
    assert paths.log == paths.state_dir / "daemon.log"
    assert paths.info == paths.state_dir / "daemon.json"
    assert paths.socket == paths.socket_dir / "daemon.sock"
    assert not paths.state_dir.exists()  # resolution creates nothing


def test_a_shared_runtime_dir_gives_each_home_its_own_socket(
    tmp_path: Path, short_tmp: Path
) -> None:
    """Homes sharing MC_RUNTIME_DIR never share (or act on) one socket path."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    alias = tmp_path / "alias"
    alias.symlink_to(a)
    env = {RUNTIME_DIR_ENV: str(short_tmp)}
    sock_a = runtime_paths(ctx(a, **env)).socket
    sock_b = runtime_paths(ctx(b, **env)).socket
    assert sock_a.parent == sock_b.parent == short_tmp
    assert sock_a != sock_b
    assert sock_a.name == f"daemon-{home_hash(a)}.sock"
    assert runtime_paths(ctx(alias, **env)).socket == sock_a  # resolved: one daemon
    # Without the override each home's socket dir is its own, named daemon.sock.
    assert runtime_paths(ctx(a)).socket.name == "daemon.sock"


def test_the_shared_socket_name_is_within_the_path_bound(home: Path) -> None:
    name = f"daemon-{home_hash(home)}.sock"
    fits = Path("/" + "r" * (MAX_SOCKET_PATH_BYTES - len(name) - 2))
    paths = runtime_paths(ctx(home, **{RUNTIME_DIR_ENV: str(fits)}))
    assert len(os.fsencode(paths.socket)) == MAX_SOCKET_PATH_BYTES
    with pytest.raises(SocketPathTooLong):
        runtime_paths(ctx(home, **{RUNTIME_DIR_ENV: str(fits) + "r"}))


# --- the resolution the shim uses (an MC_HOME and an environment) ------------------


def test_home_hash_is_the_sha256_of_the_resolved_home(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    alias = tmp_path / "alias"
    alias.symlink_to(real)
    expected = hashlib.sha256(os.fsencode(real.resolve())).hexdigest()[:12]
    assert home_hash(alias) == home_hash(str(real)) == expected


def test_the_shims_socket_path_is_the_runtime_paths_one(
    home: Path, private_base: Path, short_tmp: Path
) -> None:
    for env in ({}, {"XDG_RUNTIME_DIR": str(private_base)}, {RUNTIME_DIR_ENV: str(short_tmp)}):
        paths = runtime_paths(ctx(home, **env))
        assert daemon_socket(str(home), env) == paths.socket
        assert socket_path(runtime_dir_of(str(home), env), socket_name_of(str(home), env)) == (
            paths.socket
        )
