"""The daemon keeps none of its starter's environment (issue #12 item 4, RFC-0002 §3).

A client whose environment holds a provider key starts the daemon on demand and runs a
turn with that key; afterwards the key is not in the daemon's ``/proc/<pid>/environ``
(the daemon re-execs itself with its allow-list, same pid), and a second client without
the variable cannot read it through the shell tool, neither from its own environment
nor from the daemon's.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from magi_code.tools.environment import is_daemon_variable
from tests.process.daemon.support import cli, status, wait_for
from tests.process.turn_support import run_turn
from tests.support.fake_providers import FakeProviderServer, FakeToolCall, Reply
from tests.support.service import running_service, service_env

PLANTED = "sk-planted-0123456789abcdef"
OTHER_SECRETS = {
    "GITHUB_TOKEN": "ghp_planted_token_0000",
    "HTTPS_PROXY": "http://planted-user:planted-pass@127.0.0.1:9",
    "AWS_SECRET_ACCESS_KEY": "aws-planted-secret-0000",
}

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/<pid>/environ"
)


def _settings(home: Path, fake: FakeProviderServer) -> None:
    base_url = f"{fake.base_url}/v1"
    doc = {
        "provider": "keyed",
        "model": "m1",
        "providers": {
            "keyed": {
                "api": "openai-chat",
                "base_url": base_url,
                "api_key_env": "MY_PROVIDER_API_KEY",
            },
            "open": {"api": "openai-chat", "base_url": base_url},
        },
    }
    (home / "settings.json").write_text(json.dumps(doc))


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(
        entry.decode(errors="replace").partition("=")[::2] for entry in raw.split(b"\0") if entry
    )


def _shell(call_id: str, command: str) -> FakeToolCall:
    return FakeToolCall(call_id, "shell", json.dumps({"command": command}))


async def test_a_planted_key_is_used_for_its_turn_and_then_nowhere_in_the_daemon(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    _settings(home, fake)
    fake.enqueue(Reply(text=["keyed answer"]))
    starter = {"MY_PROVIDER_API_KEY": PLANTED, **OTHER_SECRETS}
    async with running_service(home, project, starter) as svc:
        _, turn = await run_turn(svc, "use the key")
        assert turn.terminal["status"] == "completed", turn.terminal
        # The key came from the connection's launch context, and reached the provider.
        assert fake.requests[0].headers["authorization"] == f"Bearer {PLANTED}"

        daemon = await asyncio.to_thread(status, home)
        assert daemon["running"] is True
        pid = daemon["pid"]
        environ = _environ(pid)
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        for value in (PLANTED, *OTHER_SECRETS.values()):
            assert value.encode() not in raw
        # The starter spawned it with exactly the allow-list: it never had to re-exec.
        assert {name for name in environ if not is_daemon_variable(name)} == set()
        assert "MC_DAEMON_REEXEC" not in environ
        assert environ["MC_HOME"] == str(home)
        # Not the shim's child (it forked away from the process the starter spawned).
        assert psutil.Process(pid).ppid() != svc.proc.pid

        # A second client without the variable (the first is still connected): its shell
        # tool reads its own environment and its parent's, the daemon's. The output goes
        # to the model, i.e. to the provider's next request.
        fake.enqueue(
            Reply(
                text=[],
                tool_calls=[
                    _shell("e1", "env"),
                    _shell("e2", "echo ppid=$PPID; tr '\\0' '\\n' < /proc/$PPID/environ"),
                    _shell("e3", f"tr '\\0' '\\n' < /proc/{pid}/environ; ps eww -p {pid}"),
                ],
            ),
            Reply(text=["looked"]),
        )
        async with running_service(home, project, {"MC_PROVIDER": "open"}) as second:
            _, looked = await run_turn(second, "look for keys")
        assert looked.terminal["status"] == "completed", looked.terminal
        assert (await asyncio.to_thread(status, home))["pid"] == pid  # one daemon for both
    tool_round = fake.requests[-1]
    assert "authorization" not in tool_round.headers
    body = tool_round.body.decode()
    assert f"ppid={pid}" in body  # the shell's parent is the daemon
    assert f"MC_HOME={home}" in body  # and it did read the daemon's environment
    for value in (PLANTED, *OTHER_SECRETS.values()):
        assert value not in body
    for session in (home / "sessions").iterdir():
        if session.is_dir() and not session.name.startswith("."):
            assert PLANTED not in (session / "history.jsonl").read_text()
    assert PLANTED not in (home / "run" / "daemon.log").read_text()


async def test_a_foreground_daemon_re_execs_in_place_with_its_allow_list(home: Path) -> None:
    env = service_env(home, {"MY_PROVIDER_API_KEY": PLANTED, "MC_DAEMON_IDLE_SECONDS": "0"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "magi_code", "daemon", "run"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # "running" alone is also true while it starts (lock held, not yet answering).
        await wait_for(lambda: "instance_id" in status(home), 30, "the daemon to answer")
        assert status(home)["pid"] == proc.pid  # exec keeps the pid a unit manager watches
        environ = _environ(proc.pid)
        assert PLANTED not in "".join(environ.values())
        assert environ["MC_DAEMON_IDLE_SECONDS"] == "0"
        assert environ["MC_DAEMON_REEXEC"] == str(proc.pid)
        assert {name for name in environ if not is_daemon_variable(name)} == set()
    finally:
        stopped = await asyncio.to_thread(cli, home, "daemon", "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert proc.wait(timeout=30) == 0
