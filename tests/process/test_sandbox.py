"""The ``workspace_write`` sandbox (issue #33 item 4, ``docs/safety.md``), both modes.

Under ``sandbox: workspace_write`` the model's shell commands and hooks run under
bubblewrap: they write in the project and a private ``/tmp`` only, reach no listener on
the host's loopback, and see neither ``MC_HOME`` nor the daemon's socket directory. The
same commands under ``sandbox: none`` do all of it (so the test can fail), and
``sandbox_network: true`` gives back the network alone. Where the
sandbox cannot start, a turn that asks for it fails with ``sandbox_unavailable`` before
any command runs.
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from magi_code.tools.sandbox import bubblewrap
from magi_code.turns.failures import REMEDIES, SANDBOX_UNAVAILABLE
from tests.process.turn_support import run_turn, write_settings
from tests.support import service
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, RecordedRequest, Reply
from tests.support.sandbox_python import PYTHON
from tests.support.service import running_service

pytestmark = pytest.mark.skipif(
    bubblewrap().path is None, reason="needs a usable bubblewrap (Linux, user namespaces)"
)


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside the project and outside ``/tmp`` (the sandbox's private
    ``/tmp`` would hide what is there anyway), with a short path for a socket."""
    path = Path(tempfile.mkdtemp(prefix="mc-sbx-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Listener:
    """A TCP listener on the host's loopback that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    try:
        yield server
    finally:
        server.close()


def _shell(call_id: str, command: str) -> FakeToolCall:
    return FakeToolCall(call_id, "shell", json.dumps({"command": command}))


def _tool_outputs(request: RecordedRequest) -> dict[str, str]:
    body = orjson.loads(request.body)
    return {
        message["tool_call_id"]: str(message["content"])
        for message in body["messages"]
        if message.get("role") == "tool"
    }


# Both modes for the confining level (tools are spawned by the embedded service or by the
# daemon); the levels themselves are the shared core's, once.
@pytest.mark.parametrize(
    ("level", "network"),
    [
        ("none", False),
        pytest.param("workspace_write", False, marks=pytest.mark.both_modes),
        ("workspace_write", True),
    ],
)
async def test_workspace_write_confines_shell_commands(
    home: Path,
    project: Path,
    outside: Path,
    listener: Listener,
    fake: FakeProviderServer,
    level: str,
    network: bool,
) -> None:
    runtime_dir = outside / "run"
    runtime_dir.mkdir(mode=0o700)
    hook_escape = outside / "hook.txt"
    hook = f"cat > hook-event.json; echo out > {shlex.quote(str(hook_escape))}; exit 0"
    hooks = {"pre_tool_use": [{"command": ["/bin/sh", "-c", hook], "matcher": "shell"}]}
    write_settings(home, fake, sandbox=level, sandbox_network=network, hooks=hooks)
    # A project file cannot loosen the global level, trusted or not.
    (project / ".magi-code").mkdir()
    (project / ".magi-code" / "settings.json").write_text(json.dumps({"sandbox": "none"}))
    script = (
        f'import socket; socket.create_connection(("127.0.0.1", {listener.port}), timeout=10); '
        'print("CONNECTED")'
    )
    connect = f"{shlex.quote(PYTHON)} -c {shlex.quote(script)}"
    escaped = outside / "escaped.txt"
    fake.enqueue(
        Reply(
            text=[],
            tool_calls=[
                _shell("inside", "echo inside > inside.txt && cat inside.txt"),
                _shell("outside", f"echo out > {shlex.quote(str(escaped))}; echo exit=$?"),
                _shell("settings", "echo '{}' > .magi-code/settings.json; echo exit=$?"),
                _shell("tmp", 'echo private > "$TMPDIR/t" && cat "$TMPDIR/t"'),
                _shell("network", f"{connect}; echo exit=$?"),
                _shell(
                    "hidden",
                    f"ls -A {shlex.quote(str(home))} {shlex.quote(str(runtime_dir))}; echo LISTED",
                ),
            ],
        ),
        Reply(text=["done"]),
    )
    launch = {"MC_RUNTIME_DIR": str(runtime_dir), "MC_DAEMON_IDLE_SECONDS": "300"}
    try:
        async with running_service(home, project, launch) as svc:
            _, turn = await run_turn(svc, "try to get out")
            assert turn.terminal["status"] == "completed", turn.terminal
            daemon_socket = [path.name for path in runtime_dir.iterdir()]
    finally:
        service.stop_daemon(home)  # through daemon.json, before its socket directory goes
    out = _tool_outputs(fake.requests[1])
    confined = level == "workspace_write"

    assert out["inside"].startswith("inside"), out["inside"]
    assert (project / "inside.txt").read_text() == "inside\n"
    assert "private" in out["tmp"], out["tmp"]

    assert escaped.exists() is not confined, out["outside"]
    # Hooks run in the same sandbox, their event on stdin.
    event = json.loads((project / "hook-event.json").read_text())
    assert event["event"] == "pre_tool_use" and event["tool_name"] == "shell", event
    assert hook_escape.exists() is not confined
    assert ("exit=0" in out["outside"]) is not confined, out["outside"]
    assert ("exit=0" in out["settings"]) is not confined, out["settings"]

    offline = confined and not network
    assert listener.accepted == (0 if offline else 1), out["network"]
    assert ("CONNECTED" in out["network"]) is not offline, out["network"]

    listed = out["hidden"]
    assert "LISTED" in listed, listed
    assert ("settings.json" in listed) is not confined, listed
    if service.current_mode() == "daemon":
        assert daemon_socket, "the daemon's socket is in MC_RUNTIME_DIR"
        for name in daemon_socket:
            assert (name in listed) is not confined, listed


@pytest.mark.both_modes
async def test_a_turn_asking_for_an_unusable_sandbox_fails_with_its_label(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, sandbox="workspace_write")
    fake.enqueue(
        Reply(text=[], tool_calls=[_shell("run", "echo ran > ran.txt")]), Reply(text=["x"])
    )
    # A bwrap that cannot start a sandbox: no fallback to running unconfined.
    async with running_service(home, project, {"MC_BWRAP": "/bin/false"}) as svc:
        response = await svc.request("turn.start", {"prompt": "hi"})
        assert response["error"] is None, response
        turn_id = response["payload"]["turn_id"]
        events = await svc.events_until_terminal(response["request_id"])
        terminal = events[-1]["payload"]
        assert terminal["status"] == "failed", terminal
        assert terminal["failure"] == SANDBOX_UNAVAILABLE, terminal
        await svc.close_stdin()
        assert await svc.wait() == 0
        stderr = await svc.stderr_text()
    service.stop_daemon(home)
    assert fake.requests == []  # failed before the provider was asked for a command
    assert not (project / "ran.txt").exists()
    line = f"magi-code: turn {turn_id} failed: {SANDBOX_UNAVAILABLE} — "
    assert f"{line}{REMEDIES[SANDBOX_UNAVAILABLE]}" in stderr.splitlines(), stderr
