"""Peer credentials of a connected ``AF_UNIX`` socket, checked on both ends.

The daemon checks the connecting client's UID before reading a byte; the client checks the
daemon's UID before sending one. Works on a plain ``socket.socket`` and on what asyncio or
uvloop transports return from ``get_extra_info("socket")`` (both expose ``getsockopt`` and
``fileno``). Any failure to read credentials counts as a foreign peer in :func:`check_peer`.

:func:`peer_pid` reads the connecting process's PID from the same credentials (Linux
``SO_PEERCRED``, macOS ``LOCAL_PEERPID``), for the daemon's tool barrier
(:mod:`magi_code.endpoint.ancestry`); it is None where the platform does not say.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from typing import Final, Protocol


class PeerCredentialsUnavailable(Exception):
    """The platform or socket cannot report the peer's credentials."""


class SocketLike(Protocol):
    def fileno(self) -> int: ...

    def getsockopt(self, level: int, optname: int, buflen: int, /) -> bytes: ...


# Linux struct ucred {pid_t pid; uid_t uid; gid_t gid;}
_UCRED: Final = struct.Struct("=iII")
# BSD/macOS struct xucred {u_int cr_version; uid_t cr_uid; short cr_ngroups; gid_t[16]}
_XUCRED_HEAD: Final = struct.Struct("=II")
_XUCRED_SIZE: Final = 76
_XUCRED_VERSION: Final = 0
_SOL_LOCAL: Final = 0
_LOCAL_PEERCRED: Final = 0x001
# macOS: the pid_t of the process that connected (LOCAL_PEERPID in <sys/un.h>).
_LOCAL_PEERPID: Final = 0x002
_PID: Final = struct.Struct("=i")
# A plain str so the BSD/macOS branch stays type-checked when mypy runs on Linux.
_PLATFORM: str = sys.platform


def peer_uid(sock: SocketLike) -> int:
    """The effective UID of the process at the other end of a connected Unix socket."""
    if _PLATFORM.startswith("linux"):
        return _linux_peer_uid(sock)
    if _PLATFORM == "darwin" or "bsd" in _PLATFORM:
        try:
            return _xucred_peer_uid(sock)
        except PeerCredentialsUnavailable:
            return _getpeereid(sock.fileno())
    raise PeerCredentialsUnavailable("peer credentials are not supported on this platform")


def peer_pid(sock: SocketLike) -> int | None:
    """The PID of the process that connected, or None when the platform cannot say.

    None also for a PID of 0: the kernel reports that for a peer outside our PID
    namespace, which is no process we could look up.
    """
    try:
        if _PLATFORM.startswith("linux"):
            pid, _uid, _gid = _linux_ucred(sock)
        elif _PLATFORM == "darwin":
            raw = _local_option(sock, "LOCAL_PEERPID", _LOCAL_PEERPID, _PID.size)
            if len(raw) != _PID.size:
                return None
            (pid,) = _PID.unpack(raw)
        else:
            return None
    except PeerCredentialsUnavailable:
        return None
    return int(pid) if pid > 0 else None


def check_peer(sock: SocketLike) -> bool:
    """True only when the peer runs as our effective UID (fails closed)."""
    try:
        return peer_uid(sock) == os.geteuid()
    except PeerCredentialsUnavailable:
        return False


def _linux_ucred(sock: SocketLike) -> tuple[int, int, int]:
    """The peer's ``struct ucred`` (pid, uid, gid) from ``SO_PEERCRED``."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        raise PeerCredentialsUnavailable("SO_PEERCRED failed") from None
    if len(raw) != _UCRED.size:
        raise PeerCredentialsUnavailable("SO_PEERCRED returned an unexpected size")
    pid, uid, gid = _UCRED.unpack(raw)
    return int(pid), int(uid), int(gid)


def _linux_peer_uid(sock: SocketLike) -> int:
    _pid, uid, _gid = _linux_ucred(sock)
    return uid


def _local_option(sock: SocketLike, name: str, default: int, size: int) -> bytes:
    """A ``SOL_LOCAL`` socket option (BSD/macOS ``LOCAL_PEERCRED``, ``LOCAL_PEERPID``)."""
    level = getattr(socket, "SOL_LOCAL", _SOL_LOCAL)
    option = getattr(socket, name, default)
    try:
        return sock.getsockopt(level, option, size)
    except OSError:
        raise PeerCredentialsUnavailable(f"{name} failed") from None


def _xucred_peer_uid(sock: SocketLike) -> int:
    raw = _local_option(sock, "LOCAL_PEERCRED", _LOCAL_PEERCRED, _XUCRED_SIZE)
    if len(raw) < _XUCRED_HEAD.size:
        raise PeerCredentialsUnavailable("LOCAL_PEERCRED returned an unexpected size")
    version, uid = _XUCRED_HEAD.unpack_from(raw)
    if version != _XUCRED_VERSION:
        raise PeerCredentialsUnavailable("LOCAL_PEERCRED returned an unknown xucred version")
    return int(uid)


def _getpeereid(fd: int) -> int:
    # Imported here: ctypes.util pulls in subprocess and tempfile, a cost every stdio
    # shim start would pay for a fallback only BSD-like systems reach.
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        raise PeerCredentialsUnavailable("libc not found for getpeereid")
    libc = ctypes.CDLL(name, use_errno=True)
    getpeereid = getattr(libc, "getpeereid", None)
    if getpeereid is None:
        raise PeerCredentialsUnavailable("getpeereid is not available")
    uid = ctypes.c_uint32()
    gid = ctypes.c_uint32()
    if getpeereid(fd, ctypes.byref(uid), ctypes.byref(gid)) != 0:
        raise PeerCredentialsUnavailable("getpeereid failed")
    return int(uid.value)
