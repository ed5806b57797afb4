"""The daemon refuses its own tool processes (issue #13 item 5, issue #33 item 5,
``docs/unix-daemon.md``, ``docs/safety.md``).

The model's shell tool runs, as the user, scripts that find the daemon's socket the way
an attacker would (``daemon.json`` names it; the test hands the path over explicitly) and
try to drive it: a raw v2 control ``stop``, one that writes and exits without waiting,
a burst of 64 of those from a process that exits at once (accepted after it is gone),
``magi-code daemon stop``/``status`` and a stdio shim with ``MC_HOME`` set by hand (in
daemon mode and in the default mode, which does not fall back to serving in-process on a
refusal). Each is refused with ``tool_process`` before the daemon reads a byte; the daemon keeps
serving, the turn completes, and the same script run by a process that is not the
daemon's descendant is admitted.

A tool process that detaches (``setsid -f``) stays the daemon's descendant (the daemon is
its subreaper) and is refused too; in the ``workspace_write`` sandbox it cannot even see
the socket. What detached processes leave is reaped, and they end with the daemon.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from magi_code.tools.sandbox import bubblewrap
from tests.process.daemon.support import status
from tests.process.turn_support import run_turn, write_settings
from tests.support import service
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, RecordedRequest, Reply
from tests.support.sandbox_python import PYTHON, importable_in
from tests.support.service import running_service

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith(("linux", "darwin")), reason="needs the peer's pid"
)

# Connects to the socket in argv[1] as a control client of the home in argv[2], sends
# argv[3] ("stop" or "status") and prints every frame it gets back as one JSON line.
# With argv[4] == "no-wait" it writes its frames and exits at once.
CLIENT = """
import json, os, socket, sys
from magi_code.protocol.frames import FrameDecoder, encode_frame
from magi_code.protocol.v2 import Launch, hello

path, home, op = sys.argv[1:4]
wait = sys.argv[4:] != ["no-wait"]
frames = []
if sys.argv[4:] == ["burst"]:
    # Write hello and the operation on many connections, then exit at once: most are
    # accepted after this process is gone.
    data = encode_frame(hello("control", Launch(home, "", {}), "barrier-test", "0"))
    data += encode_frame({"t": "control", "id": 1, "op": op})
    held = []
    for _ in range(64):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        try:
            sock.sendall(data)
        except OSError:
            pass
        held.append(sock)
    os._exit(0)
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
    sock.settimeout(20)
    try:
        sock.connect(path)
    except OSError as exc:  # no socket to be seen (the sandbox)
        print("FRAMES " + json.dumps([{"connect_error": type(exc).__name__}]), flush=True)
        sys.exit(0)
    try:
        sock.sendall(
            encode_frame(hello("control", Launch(home, "", {}), "barrier-test", "0"))
            + encode_frame({"t": "control", "id": 1, "op": op})
        )
    except OSError as exc:  # the daemon may have closed already
        frames.append({"send_error": type(exc).__name__})
    decoder = FrameDecoder()
    while wait:
        try:
            chunk = sock.recv(65536)
        except OSError as exc:
            frames.append({"recv_error": type(exc).__name__})
            break
        if not chunk:
            break
        frames.extend(decoder.feed(chunk))
        if any(f.get("t") in ("control_result", "refused") for f in frames):
            break
print("FRAMES " + json.dumps(frames, sort_keys=True), flush=True)
"""


REFUSAL = {
    "t": "refused",
    "code": "tool_process",
    "message": "connections from the agent's tool processes are refused",
}
SANDBOX_LEVELS = [
    "none",
    pytest.param(
        "workspace_write",
        marks=pytest.mark.skipif(bubblewrap().path is None, reason="needs a usable bubblewrap"),
    ),
]


def _shell(call_id: str, command: str) -> FakeToolCall:
    return FakeToolCall(call_id, "shell", json.dumps({"command": command}))


def _tool_outputs(request: RecordedRequest) -> dict[str, str]:
    """The tool results an openai-chat request carries, by tool call id."""
    body = orjson.loads(request.body)
    return {
        message["tool_call_id"]: str(message["content"])
        for message in body["messages"]
        if message.get("role") == "tool"
    }


def _frames(output: str) -> list[dict[str, Any]]:
    """What the client script printed: the frames it received, and any send/recv error."""
    (line,) = [line for line in output.splitlines() if line.startswith("FRAMES ")]
    frames: list[dict[str, Any]] = json.loads(line.removeprefix("FRAMES "))
    return frames


def _recorded_socket(home: Path) -> str:
    """Where an attacker finds the socket: ``daemon.json``."""
    info = json.loads((home / "run" / "daemon.json").read_text())
    path = info["socket"]
    assert isinstance(path, str) and Path(path).exists()
    return path


async def test_tool_processes_are_refused_and_the_daemon_keeps_serving(
    home: Path, project: Path, tmp_path: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    py = shlex.quote(sys.executable)
    async with running_service(home, project) as svc:
        daemon = await asyncio.to_thread(status, home)
        assert daemon["running"] is True and "instance_id" in daemon, daemon
        sock = _recorded_socket(home)
        client = f"{py} {shlex.quote(str(script))} {shlex.quote(sock)} {shlex.quote(str(home))}"
        default = f"MC_HOME={shlex.quote(str(home))} {py} -m magi_code"
        by_hand = f"MC_HOME={shlex.quote(str(home))} MC_SERVICE_MODE=daemon {py} -m magi_code"
        fake.enqueue(
            Reply(
                text=[],
                tool_calls=[
                    _shell("raw-stop", f"{client} stop"),
                    _shell("raw-status", f"{client} status"),
                    _shell("fire-and-forget", f"{client} stop no-wait; sleep 1"),
                    _shell("burst", f"{client} stop burst; echo exit=$?; sleep 1"),
                    _shell("cli-stop", f"{by_hand} daemon stop; echo exit=$?"),
                    _shell("cli-status", f"{by_hand} daemon status --json; echo exit=$?"),
                    _shell("shim", f"{by_hand} --app service </dev/null; echo exit=$?"),
                    # The default mode does not bypass a refusal by serving in-process.
                    _shell("shim-default", f"{default} --app service </dev/null; echo exit=$?"),
                ],
            ),
            Reply(text=["the daemon said no"]),
        )
        _, turn = await run_turn(svc, "drive the daemon from a tool")
        assert turn.terminal["status"] == "completed", turn.terminal

        # Still the same daemon, and a normal client (this test) is served.
        after = await asyncio.to_thread(status, home)
        assert after["running"] is True and after.get("responding") is not False, after
        assert (after["pid"], after["instance_id"]) == (daemon["pid"], daemon["instance_id"])
        assert after["clients"] == 1  # the shim of this test, nothing left by the tools

        # The same raw client, run by a process that does not descend from the daemon.
        admitted = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(script), sock, str(home), "status"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert admitted.returncode == 0, admitted.stderr
        answered = _frames(admitted.stdout)
        assert [frame["t"] for frame in answered] == ["welcome", "control_result"], answered
        assert answered[1]["result"]["pid"] == daemon["pid"]

        # The session goes on: a second turn on the same connection completes.
        fake.enqueue(Reply(text=["still here"]))
        _, again = await run_turn(svc, "and now?")
        assert again.terminal["status"] == "completed", again.terminal

    outputs = _tool_outputs(fake.requests[1])
    refusal = REFUSAL
    # Exactly the refusal, and no send error: the daemon keeps the socket open until the
    # client has written its hello and read the answer.
    for call_id in ("raw-stop", "raw-status"):
        assert _frames(outputs[call_id]) == [refusal], outputs[call_id]
    assert _frames(outputs["fire-and-forget"]) == []  # wrote hello + stop, did not wait
    assert "exit=0" in outputs["burst"], outputs["burst"]
    reason = (
        "the daemon refused the connection (tool_process): commands run by the agent's "
        "tools cannot use the daemon"
    )
    stop_out = outputs["cli-stop"]
    assert f"magi-code: cannot stop the daemon: {reason}" in stop_out, stop_out
    assert "exit=1" in stop_out and "daemon stopped" not in stop_out
    status_out = outputs["cli-status"]
    reported = orjson.loads(status_out.splitlines()[0])
    assert reported["responding"] is False and reason in reported["error"], status_out
    for call_id in ("shim", "shim-default"):
        shim_out = outputs[call_id]
        shim_lines = [line for line in shim_out.splitlines() if line.startswith("magi-code:")]
        assert shim_lines == [f"magi-code: cannot reach the daemon: {reason}"], shim_out
        assert "exit=1" in shim_out

    log = (home / "run" / "daemon.log").read_text()
    assert log.count("refused a connection code=tool_process") >= 7 + 64, log
    assert "serving in-process" not in log


async def test_tool_children_see_no_daemon_variable_or_socket_path(
    home: Path, project: Path, fake: FakeProviderServer, runtime_dir: Path
) -> None:
    write_settings(home, fake)
    fake.enqueue(
        Reply(text=[], tool_calls=[_shell("env", "env; echo ENV-END")]),
        Reply(text=["seen"]),
    )
    launch = {
        "MC_DAEMON_IDLE_SECONDS": "300",
        "MC_RUNTIME_DIR": str(runtime_dir),
        "MC_DAEMON_SOCKET": str(runtime_dir / "planted.sock"),
    }
    async with running_service(home, project, launch) as svc:
        sock = _recorded_socket(home)
        assert Path(sock).parent == runtime_dir
        _, turn = await run_turn(svc, "dump the environment")
        assert turn.terminal["status"] == "completed", turn.terminal
    dumped = _tool_outputs(fake.requests[1])["env"]
    assert "ENV-END" in dumped and "PATH=" in dumped, dumped
    names = {line.partition("=")[0] for line in dumped.splitlines() if "=" in line}
    assert not {name for name in names if name.startswith("MC_")}, names
    for needle in (sock, str(runtime_dir), str(home), ".sock"):
        assert needle not in dumped, needle


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_a_detached_tool_process_cannot_stop_the_daemon(
    home: Path, project: Path, fake: FakeProviderServer, level: str
) -> None:
    write_settings(home, fake, sandbox=level)
    # In the project: the sandbox's private /tmp hides the test's temporary files.
    script = project / "client.py"
    script.write_text(CLIENT)
    out = project / "detached.out"
    async with running_service(home, project) as svc:
        daemon = await asyncio.to_thread(status, home)
        pythonpath = importable_in(project)
        client = "PYTHONPATH=" + " ".join(
            shlex.quote(word)
            for word in (pythonpath, PYTHON, str(script), _recorded_socket(home), str(home), "stop")
        )
        # The detached client outlives the shell's process group; the shell waits for its
        # answer (a sandbox ends with its shell).
        wait = f"grep -q FRAMES {shlex.quote(str(out))} 2>/dev/null && break; sleep 0.1"
        command = (
            f"setsid -f sh -c {shlex.quote(f'{client} > {shlex.quote(str(out))} 2>&1')}; "
            f"for i in $(seq 300); do {wait}; done"
        )
        fake.enqueue(
            Reply(text=[], tool_calls=[_shell("detached", command)]), Reply(text=["tried"])
        )
        _, turn = await run_turn(svc, "detach and stop the daemon")
        assert turn.terminal["status"] == "completed", turn.terminal

        after = await asyncio.to_thread(status, home)
        assert after["running"] is True and after.get("responding") is not False, after
        assert (after["pid"], after["instance_id"]) == (daemon["pid"], daemon["instance_id"])
        fake.enqueue(Reply(text=["still here"]))
        _, again = await run_turn(svc, "and now?")
        assert again.terminal["status"] == "completed", again.terminal

    expected = [REFUSAL] if level == "none" else [{"connect_error": "FileNotFoundError"}]
    assert _frames(out.read_text()) == expected, out.read_text()


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_detached_tool_processes_are_reaped_and_end_with_the_daemon(
    home: Path, project: Path, fake: FakeProviderServer, level: str
) -> None:
    write_settings(home, fake, sandbox=level)
    marker = f"mc-detached-{secrets.token_hex(6)}"
    sleeper = f"{shlex.quote(PYTHON)} -c 'import time; time.sleep(600)' {marker}"
    fake.enqueue(
        Reply(
            text=[],
            tool_calls=[_shell("detach", f"setsid -f {sleeper}; setsid -f true; sleep 0.5")],
        ),
        Reply(text=["detached"]),
    )
    async with running_service(home, project) as svc:
        _, turn = await run_turn(svc, "leave something running")
        assert turn.terminal["status"] == "completed", turn.terminal
        daemon = psutil.Process((await asyncio.to_thread(status, home))["pid"])
        left = [
            proc
            for proc in psutil.process_iter(["cmdline"])
            if marker in (proc.info["cmdline"] or [])
        ]
        if level == "none":
            # Adopted by the daemon, not by init: still its descendant.
            assert [proc.ppid() for proc in left] == [daemon.pid], left
        else:
            assert left == []  # it died with its sandbox when the command ended
        # The detached `true` exited at once; its zombie is collected.
        for _ in range(600):
            zombies = [child for child in daemon.children() if _is_zombie(child)]
            if not zombies:
                break
            await asyncio.sleep(0.05)
        assert zombies == [], zombies
    await asyncio.to_thread(service.stop_daemon, home)
    _, alive = await asyncio.to_thread(psutil.wait_procs, left, 30)
    assert alive == [], alive


def _is_zombie(child: psutil.Process) -> bool:
    """Whether ``child`` is a zombie; one reaped since it was listed is not."""
    try:
        return bool(child.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


@pytest.mark.skipif(bubblewrap().path is None, reason="needs a usable bubblewrap")
async def test_sandboxed_commands_die_with_a_killed_daemon(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, sandbox="workspace_write")
    marker = f"mc-sandboxed-{secrets.token_hex(6)}"
    sleeper = f"{shlex.quote(PYTHON)} -c 'import time; time.sleep(600)' {marker}"
    fake.enqueue(Reply(text=[], tool_calls=[_shell("long", sleeper)]), Reply(text=["never"]))
    async with running_service(home, project) as svc:
        response = await svc.request("turn.start", {"prompt": "run for long"})
        assert response["error"] is None, response
        left: list[psutil.Process] = []
        for _ in range(1200):
            left = [
                proc
                for proc in psutil.process_iter(["cmdline"])
                if marker in (proc.info["cmdline"] or [])
            ]
            if left:
                break
            await asyncio.sleep(0.05)
        assert len(left) == 1, "the sandboxed command did not start"
        daemon = (await asyncio.to_thread(status, home))["pid"]
        # No chance to stop anything: the sandbox must end on its own.
        os.kill(daemon, signal.SIGKILL)
        _, alive = await asyncio.to_thread(psutil.wait_procs, left, 30)
        assert alive == [], alive


@pytest.fixture
def runtime_dir(home: Path) -> Iterator[Path]:
    """A private ``MC_RUNTIME_DIR`` with a short path (the socket path must fit 100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="mc-barrier-", dir="/tmp"))
    try:
        yield path
    finally:
        # Stopped (through daemon.json's socket path) before its socket directory goes.
        service.stop_daemon(home)
        shutil.rmtree(path, ignore_errors=True)
