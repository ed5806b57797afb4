"""FIFOs, sockets, symlinks, directories and garbage where session files belong.

Anything running as the user (the agent's own shell tool included) can plant these in
``$MC_HOME/sessions``. ``session.list``, ``session.replay``, ``session.open`` and
``turn.start`` on every such session must answer promptly (a wedged service never
answers; the bound below is only a generous timeout), never with ``internal_error``, and
sessions without a usable history answer ``session_unavailable``. Many requests at once
must not exhaust the service's workers; afterwards it still answers ``status``, healthy
sessions still work, no traceback was logged, and it exits 0. Both service modes.
"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from magi_code.protocol import envelope
from tests.process.turn_support import replay_all, write_settings
from tests.stress.support import TIMEOUT, daemon_log, report, rng, scaled, tracebacks
from tests.support import service
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.service import ServiceProcess

pytestmark = pytest.mark.timeout(TIMEOUT)

# Generous bound for "answers promptly": a wedged service never answers at all.
PROMPT_S = 20.0
GROUP = 8
ALLOWED_ERRORS = {"session_unavailable", "session_busy", "limit_exceeded"}


@pytest.fixture(params=["embedded", "daemon"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    service.set_mode(request.param)
    try:
        yield request.param
    finally:
        service.set_mode("daemon")  # the stress conftest's mode; it restores the default


@pytest.fixture
def fifos() -> Iterator[list[Path]]:
    """At teardown every planted FIFO gets a peer, so a regression cannot hang forever."""
    planted: list[Path] = []
    yield planted
    for path in planted:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        except OSError:
            continue
        os.close(fd)


def _replace(path: Path) -> None:
    if path.is_symlink() or path.is_file() or path.is_socket() or path.is_fifo():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


Plant = Callable[[Path, Path, list[Path], list[socket.socket]], None]


def _fifo(name: str) -> Plant:
    def plant(d: Path, healthy: Path, fifos: list[Path], socks: list[socket.socket]) -> None:
        _replace(d / name)
        os.mkfifo(d / name, 0o600)
        fifos.append(d / name)

    return plant


def _directory(name: str) -> Plant:
    def plant(d: Path, healthy: Path, fifos: list[Path], socks: list[socket.socket]) -> None:
        _replace(d / name)
        (d / name).mkdir()
        (d / name / "inner").write_text("x")

    return plant


def _symlink(name: str, target: str | None) -> Plant:
    def plant(d: Path, healthy: Path, fifos: list[Path], socks: list[socket.socket]) -> None:
        _replace(d / name)
        (d / name).symlink_to(target or healthy / name)

    return plant


def _content(name: str, make: Callable[[Path], bytes]) -> Plant:
    def plant(d: Path, healthy: Path, fifos: list[Path], socks: list[socket.socket]) -> None:
        data = make(d)
        _replace(d / name)
        (d / name).write_bytes(data)

    return plant


def _socket_file(d: Path, healthy: Path, fifos: list[Path], socks: list[socket.socket]) -> None:
    _replace(d / "history.jsonl")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:  # the full path is longer than a socket address may be
        sock.bind(f"/proc/self/fd/{fd}/history.jsonl")
    finally:
        os.close(fd)
    sock.listen(1)
    socks.append(sock)


def _session_symlink(d: Path, healthy: Path, fifos: list[Path], socks: list[socket.socket]) -> None:
    shutil.rmtree(d)
    d.symlink_to(healthy, target_is_directory=True)


def _session_file(d: Path, healthy: Path, fifos: list[Path], socks: list[socket.socket]) -> None:
    shutil.rmtree(d)
    d.write_text("not a directory")


def _header(d: Path) -> bytes:
    return (d / "history.jsonl").read_bytes().split(b"\n", 1)[0] + b"\n"


HUGE = 3 * 1024 * 1024

# Sessions that have no usable history: every request on them is session_unavailable.
UNUSABLE: dict[str, Plant] = {
    "fifo_history": _fifo("history.jsonl"),
    "fifo_append_lock": _fifo("append.lock"),
    "dir_history": _directory("history.jsonl"),
    "dir_append_lock": _directory("append.lock"),
    "socket_history": _socket_file,
    "symlink_history": _symlink("history.jsonl", None),
    "symlink_history_dev_zero": _symlink("history.jsonl", "/dev/zero"),
    "symlink_session": _session_symlink,
    "file_session": _session_file,
}
# Listing reads no lock file: these are listed, and fail only when used.
LISTABLE = {"fifo_append_lock", "dir_append_lock"}
# Damaged but readable, or a broken sidecar or lease file: any prompt, clean answer.
DAMAGED: dict[str, Plant] = {
    "fifo_meta": _fifo("meta.json"),
    "fifo_lease_lock": _fifo("lease.lock"),
    "dir_meta": _directory("meta.json"),
    "dir_lease_lock": _directory("lease.lock"),
    "symlink_meta_dev_zero": _symlink("meta.json", "/dev/zero"),
    "symlink_lease_lock": _symlink("lease.lock", None),
    "random_history": _content("history.jsonl", lambda d: os.urandom(64 * 1024)),
    "empty_history": _content("history.jsonl", lambda d: b""),
    "huge_torn_line": _content("history.jsonl", lambda d: _header(d) + b"x" * HUGE),
    "huge_middle_line": _content(
        "history.jsonl", lambda d: _header(d) + b'{"v":1,"seq":1,' + b"y" * HUGE + b"}\n"
    ),
    "nul_history": _content("history.jsonl", lambda d: _header(d) + b"\0" * 100_000),
    "random_meta": _content("meta.json", lambda d: os.urandom(1024 * 1024)),
    "huge_meta": _content("meta.json", lambda d: b'{"v":1,"title":"' + b"t" * HUGE + b'"}'),
}


async def _created(svc: ServiceProcess) -> str:
    created = await svc.request("session.create")
    assert created["error"] is None, created
    session_id: str = created["payload"]["session_id"]
    closed = await svc.request("session.close", session_id=session_id)
    assert closed["error"] is None, closed
    return session_id


def _code(response: dict[str, Any]) -> str | None:
    error = response["error"]
    if error is None:
        return None
    assert isinstance(error, dict) and isinstance(error["code"], str), response
    return error["code"]


async def _pipelined(
    svc: ServiceProcess, method: str, targets: dict[str, str], payload: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """One request per session, all sent before any answer is read."""
    rids = {}
    for name, session_id in targets.items():
        rid = svc.next_id(method)
        rids[name] = rid
        await svc.send(envelope.request(rid, method, payload, session_id))
    return {name: await svc.response_for(rid, PROMPT_S) for name, rid in rids.items()}


async def _list_all(svc: ServiceProcess) -> tuple[set[str], int]:
    ids: set[str] = set()
    incomplete = 0
    after = None
    for _ in range(100):
        payload: dict[str, Any] = {} if after is None else {"after": after}
        listed = await svc.request("session.list", payload, timeout=PROMPT_S)
        assert listed["error"] is None, listed
        ids |= {s["session_id"] for s in listed["payload"]["sessions"]}
        incomplete += bool(listed["payload"].get("incomplete"))
        if not listed["payload"]["truncated"]:
            return ids, incomplete
        after = listed["payload"]["next_after"]
    raise AssertionError("session.list did not end")


async def _replay_elsewhere(home: Path, project: Path, session_id: str) -> str | None:
    other = await ServiceProcess.start(home, project)
    try:
        await other.initialize()
        reply = await other.request("session.replay", session_id=session_id, timeout=PROMPT_S)
        return _code(reply)
    finally:
        await other.close_stdin()
        await other.wait(PROMPT_S)


async def test_hostile_session_files_answer_promptly_in_both_modes(
    home: Path, project: Path, mode: str, fifos: list[Path]
) -> None:
    r = rng(f"hostile-{mode}")
    copies = scaled(1, 3)  # how many sessions of each kind
    socks: list[socket.socket] = []
    answers: collections.Counter[str] = collections.Counter()
    with FakeProviderServer() as fake:
        fake.set_default(Reply(text=["still ", "fine"]))
        write_settings(home, fake)
        svc = await ServiceProcess.start(home, project)
        try:
            await svc.initialize()
            healthy = await _created(svc)
            done = await svc.request("turn.start", {"prompt": "hi"}, session_id=healthy)
            assert done["error"] is None, done
            await svc.events_until_terminal(done["request_id"])
            await svc.request("session.close", session_id=healthy)
            sessions = home / "sessions"
            planted: dict[str, str] = {}
            kinds = list(UNUSABLE.items()) + list(DAMAGED.items())
            for copy in range(copies):
                for kind, plant in r.sample(kinds, len(kinds)):
                    session_id = await _created(svc)
                    plant(sessions / session_id, sessions / healthy, fifos, socks)
                    planted[f"{kind}#{copy}"] = session_id
            # A stray non-session entry and a staging leftover of each sort, too.
            os.mkfifo(sessions / "ses_fifo_not_a_dir", 0o600)
            fifos.append(sessions / "ses_fifo_not_a_dir")
            (sessions / ".new-ses_leftover").mkdir()

            listed, incomplete = await _list_all(svc)
            assert healthy in listed
            for name, session_id in planted.items():
                kind = name.split("#")[0]
                if kind in UNUSABLE and kind not in LISTABLE:
                    assert session_id not in listed, name

            # Other service processes replay unusable sessions at the same time (in daemon
            # mode all of them share the daemon's workers).
            unusable = [sid for name, sid in planted.items() if name.split("#")[0] in UNUSABLE]
            others = asyncio.gather(
                *(
                    _replay_elsewhere(home, project, unusable[i % len(unusable)])
                    for i in range(scaled(2, 6))
                )
            )
            results: dict[str, dict[str, str | None]] = collections.defaultdict(dict)
            names = list(planted)
            # In groups below the connection's attachment limit (16): each group is
            # replayed, opened and given a turn, every request of a step sent at once.
            for start in range(0, len(names), GROUP):
                group = {name: planted[name] for name in names[start : start + GROUP]}
                for method, payload in (
                    ("session.replay", {}),
                    ("session.open", {}),
                    ("turn.start", {"prompt": "on hostile files"}),
                ):
                    got = await _pipelined(svc, method, group, payload)
                    for name, response in got.items():
                        code = _code(response)
                        results[name][method] = code
                        answers[f"{method}:{code or 'ok'}"] += 1
                        if method == "turn.start" and code is None:
                            await svc.events_until_terminal(response["request_id"])
                for session_id in group.values():
                    await svc.request("session.close", session_id=session_id, timeout=PROMPT_S)

            assert await others == ["session_unavailable"] * scaled(2, 6)
            for name, codes in results.items():
                kind = name.split("#")[0]
                for method, code in codes.items():
                    assert code is None or code in ALLOWED_ERRORS, (name, method, code)
                    if kind in UNUSABLE:
                        assert code == "session_unavailable", (name, method, code)

            # The service is still itself: status, the healthy session, a new turn.
            status = await svc.request("status", timeout=PROMPT_S)
            assert status["error"] is None, status
            items = await replay_all(svc, healthy)
            assert [i["kind"] for i in items][-1] == "terminal"
            fresh = await svc.request("turn.start", {"prompt": "a new session"})
            assert fresh["error"] is None, fresh
            events = await svc.events_until_terminal(fresh["request_id"])
            assert events[-1]["payload"]["status"] == "completed"

            await svc.close_stdin()
            await svc.drain_stdout(PROMPT_S)
            code = await svc.wait(PROMPT_S)
            stderr = await svc.stderr_text()
        finally:
            await svc.stop()
            for sock in socks:
                sock.close()
    assert code == 0, stderr
    assert "Traceback" not in stderr, "\n".join(tracebacks(stderr))
    if mode == "daemon":
        log = daemon_log(home)
        assert "Traceback" not in log, "\n".join(tracebacks(log))
    report(
        f"hostile_sessions[{mode}]",
        planted=len(planted),
        kinds=len(UNUSABLE) + len(DAMAGED),
        listed=len(listed),
        list_incomplete_pages=incomplete,
        requests=sum(answers.values()),
        answers=dict(sorted(answers.items())),
    )
