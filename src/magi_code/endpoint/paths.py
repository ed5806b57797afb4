"""Where the daemon's runtime files live; one resolver shared by the daemon and its clients.

Two private (0700, owned by us) directories are involved:

- the **state dir** ``<MC_HOME>/run`` holds the lifetime lock (``daemon.lock``), the start
  lock (``start.lock``), the log (``daemon.log``) and the info file (``daemon.json``). It
  depends on ``MC_HOME`` alone, so every client of one ``MC_HOME`` agrees on the lock even
  when their environments differ (cron without ``XDG_RUNTIME_DIR``, a systemd unit), and
  logind removing ``$XDG_RUNTIME_DIR`` at logout never deletes a live daemon's lock inode.
- the **socket dir** (:func:`runtime_dir`) holds ``daemon.sock``. It prefers a tmpfs runtime
  dir (``$XDG_RUNTIME_DIR`` / macOS ``$TMPDIR``) named by a hash of the resolved ``MC_HOME``,
  then the state dir, then ``/tmp/magi-code-<uid>/<hash>``, whichever first keeps the socket
  path within :data:`MAX_SOCKET_PATH_BYTES`. The daemon records the path it bound in
  ``daemon.json``, so a client whose environment picked another socket dir still finds it.

``MC_RUNTIME_DIR`` (absolute) overrides the socket dir, with the same checks and no fallback.
Several homes may share it, so the socket there is named by the home's hash too
(``daemon-<hash>.sock``): every ``MC_HOME`` has its own socket path wherever it lives, and
no command for one home ever connects to, or removes, another home's socket.
Messages of :class:`UnsafeRuntimeDir` name directories: they are for the operator's stderr,
never for protocol output.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

# CPython's own SHA-256 (what hashlib falls back to): hashlib loads OpenSSL first, ~1.5 ms
# of every shim start for one short digest (docs/performance.md). The module is
# ``_sha256`` on 3.11 and ``_sha2`` from 3.12 on.
try:
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]
except ImportError:
    try:
        from _sha2 import sha256 as _sha256  # type: ignore[import-not-found]
    except ImportError:
        from hashlib import sha256 as _sha256

if TYPE_CHECKING:
    from magi_code.storage.launch import LaunchContext

APP_DIR_NAME: Final = "magi-code"
SOCKET_NAME: Final = "daemon.sock"
LOCK_NAME: Final = "daemon.lock"
START_LOCK_NAME: Final = "start.lock"
LOG_NAME: Final = "daemon.log"
INFO_NAME: Final = "daemon.json"
RUNTIME_DIR_ENV: Final = "MC_RUNTIME_DIR"

# sun_path is 108 bytes on Linux and 104 on macOS, both including the NUL; stay well inside.
MAX_SOCKET_PATH_BYTES: Final = 100
_HASH_CHARS: Final = 12


class UnsafeRuntimeDir(Exception):
    """A runtime directory is missing protections the daemon relies on.

    The message names the paths and the fix (for an operator's terminal); ``problem`` says
    what is wrong without any path (for a frontend's stderr).
    """

    def __init__(self, message: str, problem: str) -> None:
        super().__init__(message)
        self.problem = problem


class SocketPathTooLong(UnsafeRuntimeDir):
    """The socket path would not fit in ``sockaddr_un.sun_path``."""


class RuntimePaths:
    """Every file the daemon and its clients agree on for one user and ``MC_HOME``."""

    __slots__ = ("socket_dir", "socket_name", "state_dir")

    def __init__(self, state_dir: Path, socket_dir: Path, socket_name: str = SOCKET_NAME) -> None:
        self.state_dir = state_dir
        self.socket_dir = socket_dir
        self.socket_name = socket_name

    @property
    def socket(self) -> Path:
        return socket_path(self.socket_dir, self.socket_name)

    @property
    def socket_dir_is_own(self) -> bool:
        """The socket directory belongs to this ``MC_HOME`` alone (named by its hash): not
        a shared ``MC_RUNTIME_DIR`` and not the state directory."""
        return self.socket_name == SOCKET_NAME and self.socket_dir != self.state_dir

    @property
    def lock(self) -> Path:
        return self.state_dir / LOCK_NAME

    @property
    def start_lock(self) -> Path:
        return self.state_dir / START_LOCK_NAME

    @property
    def log(self) -> Path:
        return self.state_dir / LOG_NAME

    @property
    def info(self) -> Path:
        return self.state_dir / INFO_NAME


# Of a launch context; the ``*_of`` functions below take an ``MC_HOME`` and an environment
# (the stdio shim states its launch context without building a ``LaunchContext``).


def runtime_paths(ctx: LaunchContext, *, platform: str = sys.platform) -> RuntimePaths:
    return RuntimePaths(
        state_dir=state_dir_of(ctx.mc_home),
        socket_dir=runtime_dir_of(ctx.mc_home, ctx.env, platform=platform),
        socket_name=socket_name_of(ctx.mc_home, ctx.env),
    )


def socket_name(ctx: LaunchContext) -> str:
    return socket_name_of(ctx.mc_home, ctx.env)


def state_dir(ctx: LaunchContext) -> Path:
    return state_dir_of(ctx.mc_home)


def runtime_dir(ctx: LaunchContext, *, platform: str = sys.platform) -> Path:
    """The socket directory for ``ctx`` (pure resolution: nothing is created)."""
    return runtime_dir_of(ctx.mc_home, ctx.env, platform=platform)


def socket_name_of(mc_home: Path | str, env: Mapping[str, str]) -> str:
    """``daemon-<hash>.sock`` in a shared ``MC_RUNTIME_DIR``; else ``daemon.sock``.

    Every other socket dir is already private to one ``MC_HOME`` (named by its hash, or
    its own ``run/``).
    """
    if env.get(RUNTIME_DIR_ENV):
        return f"daemon-{home_hash(mc_home)}.sock"
    return SOCKET_NAME


def home_hash(mc_home: Path | str) -> str:
    """Short stable name for one ``MC_HOME`` (resolved, so aliases share one daemon)."""
    digest = _sha256(os.fsencode(Path(mc_home).resolve()))
    return str(digest.hexdigest())[:_HASH_CHARS]


def state_dir_of(mc_home: Path | str) -> Path:
    return Path(mc_home).resolve() / "run"


def runtime_dir_of(
    mc_home: Path | str, env: Mapping[str, str], *, platform: str = sys.platform
) -> Path:
    """The socket directory of ``mc_home`` (pure resolution: nothing is created)."""
    override = env.get(RUNTIME_DIR_ENV)
    if override:
        if not override.startswith("/"):
            message = f"{RUNTIME_DIR_ENV} must be an absolute path"
            raise UnsafeRuntimeDir(message, message)
        directory = Path(override)
        socket_path(directory, socket_name_of(mc_home, env))
        return directory
    name = home_hash(mc_home)
    candidates: list[Path] = []
    base_var = "TMPDIR" if platform == "darwin" else "XDG_RUNTIME_DIR"
    base = _trusted_base(env.get(base_var))
    if base is not None:
        candidates.append(base / APP_DIR_NAME / name)
    candidates.append(state_dir_of(mc_home))
    for candidate in candidates:
        if socket_path_fits(candidate):
            return candidate
    return Path(f"/tmp/{APP_DIR_NAME}-{os.geteuid()}", name)


def socket_path_fits(directory: Path, name: str = SOCKET_NAME) -> bool:
    return len(os.fsencode(directory / name)) <= MAX_SOCKET_PATH_BYTES


def socket_path(directory: Path, name: str = SOCKET_NAME) -> Path:
    path = directory / name
    if not socket_path_fits(directory, name):
        fix = f"set {RUNTIME_DIR_ENV} to a shorter private directory"
        raise SocketPathTooLong(
            f"socket path {path} is longer than {MAX_SOCKET_PATH_BYTES} bytes; {fix}",
            f"the socket path is longer than {MAX_SOCKET_PATH_BYTES} bytes; {fix}",
        )
    return path


def _trusted_base(value: str | None) -> Path | None:
    """``value`` when it is an absolute directory owned by us with no group/other access."""
    if not value or not os.path.isabs(value):
        return None
    try:
        st = os.stat(value)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return Path(value)


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with mode 0700 and verify it is private.

    Each missing component is created by ``mkdir(0o700)`` itself, never chmod'ed later, so no
    window exists where it is accessible to others. A concurrent creator is tolerated: the
    verification below decides.
    """
    if not path.is_absolute():
        raise UnsafeRuntimeDir(
            f"runtime directory {path} is not an absolute path",
            "a runtime directory is not an absolute path",
        )
    missing: list[Path] = []
    current = path
    while not os.path.lexists(current):
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise UnsafeRuntimeDir(
                f"cannot create runtime directory {directory}: {exc.strerror}",
                f"a runtime directory cannot be created ({exc.strerror})",
            ) from None
    try:
        verify_private_dir(path)
    except FileNotFoundError:
        raise UnsafeRuntimeDir(
            f"runtime directory {path} vanished while being created",
            "a runtime directory vanished while being created",
        ) from None


def verify_private_dir(path: Path | str) -> None:
    """Raise :class:`UnsafeRuntimeDir` unless ``path`` is a private directory of ours.

    Private means: not a symlink, a directory, owned by the effective UID, no group/other
    permission bits, and every ancestor owned by root or us and not writable by others
    (unless sticky, like ``/tmp``), so nobody else can swap it out. A missing directory
    raises ``FileNotFoundError`` (for a client, "no daemon has run here").
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError:
        raise UnsafeRuntimeDir(
            f"runtime directory {path} is not a directory we can open (a symlink or another "
            "file type?); remove it and retry",
            "a runtime directory is not a directory we can open (a symlink?)",
        ) from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    euid = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeRuntimeDir(
            f"runtime directory {path} is not a directory; remove it",
            "a runtime directory is not a directory",
        )
    if st.st_uid != euid:
        raise UnsafeRuntimeDir(
            f"runtime directory {path} is owned by uid {st.st_uid}, not {euid}; remove it",
            f"a runtime directory is owned by uid {st.st_uid}, not {euid}",
        )
    if st.st_mode & 0o077:
        mode = f"{stat.S_IMODE(st.st_mode):04o}"
        raise UnsafeRuntimeDir(
            f"runtime directory {path} has mode {mode}; run `chmod 700 {path}` or remove it",
            f"a runtime directory has mode {mode}, not 0700",
        )
    _verify_ancestors(path)


def _verify_ancestors(path: Path | str) -> None:
    euid = os.geteuid()
    ancestor = os.path.realpath(os.path.dirname(os.fspath(path)))
    while True:
        st = os.stat(ancestor)
        if st.st_uid not in (0, euid):
            raise UnsafeRuntimeDir(
                f"{ancestor} (an ancestor of runtime directory {path}) is owned by uid "
                f"{st.st_uid}; choose a location owned by you or root (e.g. {RUNTIME_DIR_ENV})",
                f"a directory above a runtime directory is owned by uid {st.st_uid}",
            )
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafeRuntimeDir(
                f"{ancestor} (an ancestor of runtime directory {path}) is writable by others; "
                f"run `chmod go-w {ancestor}` or choose another location",
                "a directory above a runtime directory is writable by others",
            )
        if ancestor == "/":
            return
        ancestor = os.path.dirname(ancestor)


def read_info(paths: RuntimePaths) -> dict[str, object] | None:
    """The daemon's ``daemon.json`` (pid, version, socket, ...), or None if unreadable."""
    return read_info_file(paths.info)


def read_info_file(path: Path) -> dict[str, object] | None:
    """``daemon.json`` at ``path``, or None if unreadable.

    The json module, not orjson: importing orjson costs every shim start ~10 ms.
    """
    try:
        with open(path, "rb") as file:
            data = json.loads(file.read())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
