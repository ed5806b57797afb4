"""A conventional CLI: --version, per-command help, usage errors that name what is wrong,
login/logout/auth status, doctor, and --prompt's session line, failure line and --json."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import termios
from asyncio.subprocess import PIPE
from pathlib import Path
from subprocess import DEVNULL
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from magi_code.protocol.schema import schema_documents
from magi_code.turns.failures import REMEDIES
from magi_code.version import package_version
from tests.process.turn_support import APIS, builtin_env, write_settings
from tests.support.cli import magi
from tests.support.fake_oauth import FakeOAuthIssuer
from tests.support.fake_providers import FakeProviderServer, HttpError, Reply
from tests.support.service import running_service, service_env
from tests.support.wire_schema import check_record

KEY = "sk-ant-cli-test-DISTINCTIVE-4242"


def test_version_and_per_command_help(home: Path) -> None:
    version = magi(home, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"magi-code {package_version()}"
    daemon_help = magi(home, "daemon", "--help")
    assert daemon_help.returncode == 0
    assert "usage: magi-code daemon" in daemon_help.stdout and "uninstall" in daemon_help.stdout
    install_help = magi(home, "daemon", "install", "--help")
    assert "--force" in install_help.stdout and "--print" in install_help.stdout
    assert "--no-browser" in magi(home, "login", "--help").stdout
    sessions_help = magi(home, "sessions", "--help").stdout
    assert all(action in sessions_help for action in ("list", "show", "rm"))
    assert "is refused" in magi(home, "sessions", "rm", "--help").stdout
    assert "model list" in magi(home, "doctor", "--help").stdout
    assert "zombie" in magi(home, "doctor", "--help").stdout
    assert "MC_DAEMON_LOG_BYTES" in magi(home, "daemon", "status", "--help").stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("frobnicate",), "frobnicate"),
        (("daemon", "statsu"), "statsu"),
        (("--json", "daemon", "status"), "--json"),
        (("daemon", "status", "--print"), "--print"),
        (("--session", "s-1"), "--session"),
        (("--app", "service", "--provider", "x"), "--app service"),
        ((), "usage: magi-code"),
    ],
)
def test_usage_errors_exit_2_and_name_what_is_wrong(
    home: Path, args: tuple[str, ...], named: str
) -> None:
    result = magi(home, *args)
    assert result.returncode == 2, result
    assert named in result.stderr and "Traceback" not in result.stderr


def test_login_anthropic_from_stdin_is_ready_from_the_shared_store(
    home: Path, project: Path
) -> None:
    stored = magi(home, "login", "--provider", "anthropic", stdin=KEY + "\n")
    assert stored.returncode == 0, stored.stderr
    assert KEY not in stored.stdout + stored.stderr
    status = json.loads(magi(home, "auth", "status", "--json").stdout)
    (anthropic,) = [p for p in status["providers"] if p["provider_id"] == "anthropic"]
    assert anthropic == {
        "provider_id": "anthropic",
        "auth_method": "api_key",
        "source": "shared_store",
        "readiness": "ready",
        "ready": True,
    }

    async def via_service() -> dict[str, object]:
        async with running_service(home, project) as svc:
            answer = await svc.request("auth.status")
            return dict(answer["payload"])

    payload = asyncio.run(via_service())
    assert {"provider_id": "anthropic", "readiness": "ready"}.items() <= next(
        p
        for p in payload["providers"]
        if p["provider_id"] == "anthropic"  # type: ignore[attr-defined]
    ).items()
    out = magi(home, "logout", "--provider", "anthropic")
    assert out.returncode == 0 and "removed" in out.stdout
    after = json.loads(magi(home, "auth", "status", "--json").stdout)
    assert next(p for p in after["providers"] if p["provider_id"] == "anthropic")["ready"] is False


def test_login_anthropic_refuses_an_empty_key(home: Path) -> None:
    result = magi(home, "login", "--provider", "anthropic", stdin="\n")
    assert result.returncode == 2 and "no usable API key" in result.stderr
    assert not (home / "auth.json").exists()


async def _start_codex_login(
    home: Path, issuer: FakeOAuthIssuer, *, stdin: int = PIPE, port: int = 0
) -> tuple[asyncio.subprocess.Process, str]:
    """A real ``magi-code login --no-browser`` and the authorization URL it printed."""
    env = service_env(
        home,
        {
            "MC_SERVICE_MODE": "embedded",
            "MC_CODEX_AUTH_ISSUER": issuer.url,
            "MC_OAUTH_CALLBACK_PORT": str(port),
        },
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "magi_code",
        "login",
        "--no-browser",
        stdin=stdin,
        stdout=PIPE,
        stderr=PIPE,
        env=env,
        cwd=home,
    )
    assert proc.stdout is not None
    url = ""
    while not url.startswith("http"):
        url = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
    return proc, url


async def _codex_login(home: Path, issuer: FakeOAuthIssuer, how: str) -> tuple[int, str]:
    stdin = DEVNULL if how == "browser-stdin-closed" else PIPE
    proc, url = await _start_codex_login(home, issuer, stdin=stdin)
    paste = how == "pasted-url"
    async with httpx.AsyncClient(follow_redirects=not paste, timeout=10) as browser:
        landing = await browser.get(url)
    if paste:
        # The browser ran elsewhere: the address it ended on is pasted into the terminal.
        assert proc.stdin is not None
        redirect = landing.headers["location"]
        assert parse_qs(urlsplit(redirect).query)["state"]
        proc.stdin.write(redirect.encode() + b"\n")
        await proc.stdin.drain()
    else:
        assert landing.status_code == 200
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, (out + err).decode()


@pytest.mark.parametrize("how", ["browser", "pasted-url", "browser-stdin-closed"])
def test_codex_login_completes_by_callback_or_pasted_url(home: Path, how: str) -> None:
    # With stdin closed nothing can be pasted, and the browser's callback still completes.
    with FakeOAuthIssuer(account_id="acct-cli-1") as issuer:
        code, output = asyncio.run(_codex_login(home, issuer, how))
    assert code == 0, output
    assert "Logged in to openai-codex" in output and "fake-refresh" not in output
    status = json.loads(magi(home, "auth", "status", "--json").stdout)
    assert status["providers"][0]["readiness"] == "ready"


INTERRUPTED = "magi-code: login interrupted; nothing was stored\n"


def test_ctrl_c_in_the_codex_login_is_one_line_and_stores_nothing(home: Path) -> None:
    async def interrupted() -> tuple[int, bytes, bytes]:
        with FakeOAuthIssuer() as issuer:
            proc, _ = await _start_codex_login(home, issuer)
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out, err

    code, out, err = asyncio.run(interrupted())
    assert (code, err.decode()) == (130, INTERRUPTED)
    assert b"Logged in" not in out
    assert not (home / "auth.json").exists()


def test_ctrl_c_at_the_anthropic_key_prompt_is_one_line_and_stores_nothing(home: Path) -> None:
    # A real terminal: the key prompt (no echo) on a pseudo-terminal, and Ctrl-C typed
    # on it, which its line discipline turns into SIGINT for the command.
    master, slave = os.openpty()

    def take_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        # As a command typed at a shell prompt: a suite started as a background job of a
        # shell without job control inherits SIGINT ignored, and so would the command.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(
        [sys.executable, "-m", "magi_code", "login", "--provider", "anthropic"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=service_env(home, {"MC_SERVICE_MODE": "embedded"}),
        cwd=home,
        preexec_fn=take_terminal,
    )
    os.close(slave)
    try:
        seen = _read_until(master, b"(not echoed): ")
        os.write(master, b"\x03")
        seen += _read_until(master, None)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    after_prompt = seen.decode().split("(not echoed): ", 1)[1]
    assert after_prompt.replace("\r\n", "\n").lstrip("^C") == "\n" + INTERRUPTED
    assert not (home / "auth.json").exists()


def _read_until(fd: int, marker: bytes | None, timeout: float = 30.0) -> bytes:
    """What the terminal shows up to ``marker`` (``None``: until the command closes it)."""
    seen = b""
    while marker is None or marker not in seen:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"nothing more on the terminal after {seen!r}"
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: every process closed the terminal
            chunk = b""
        if not chunk:
            assert marker is None, seen
            return seen
        seen += chunk
    return seen


def test_login_with_stdin_closed_says_so(home: Path) -> None:
    anthropic = subprocess.run(
        [sys.executable, "-m", "magi_code", "login", "--provider", "anthropic"],
        stdin=DEVNULL,
        env=service_env(home, {"MC_SERVICE_MODE": "embedded"}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert anthropic.returncode == 2
    assert anthropic.stderr == (
        "magi-code: no API key was given: standard input ended before a line was read "
        "(pipe the key in, or run this in a terminal)\n"
    )

    async def codex_without_a_listener() -> tuple[int, str]:
        # The callback port is taken: only a pasted address could complete the login.
        with socket.socket() as busy, FakeOAuthIssuer() as issuer:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            proc, _ = await _start_codex_login(
                home, issuer, stdin=DEVNULL, port=busy.getsockname()[1]
            )
            _, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, err.decode()

    code, err = asyncio.run(codex_without_a_listener())
    assert code == 1
    assert err.splitlines()[-1] == (
        "magi-code: login failed: standard input is closed and the loopback callback port "
        "could not be opened, so nothing can complete this login; free the port, or run it "
        "where the address can be pasted"
    )
    assert "in time" not in err and "Traceback" not in err
    assert not (home / "auth.json").exists()


def test_prompt_prints_the_session_and_one_failure_line_with_its_remedy(home: Path) -> None:
    (home / "settings.json").write_text(json.dumps({"provider": "anthropic", "model": "m"}))
    result = magi(home, "--prompt", "hi")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith("magi-code: session ")
    failed = [line for line in lines if " failed: " in line]
    assert len(failed) == 1 and ": auth_missing — " in failed[0], result.stderr
    assert "magi-code login" in failed[0]


def test_prompt_json_writes_schema_valid_v1_jsonl(home: Path, fake: FakeProviderServer) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["json ", "mode"]))
    result = magi(home, "--prompt", "hi", "--json")
    assert result.returncode == 0, result.stderr
    messages = [json.loads(line) for line in result.stdout.splitlines()]
    for message in messages:
        check_record(message)  # the shipped JSON Schemas
    # The turn's events and nothing else; its session is on stderr, as in text mode.
    assert {(m["kind"], m["request_id"]) for m in messages} == {("event", "turn")}
    assert messages[0]["event"] == "turn.started" and messages[-1]["event"] == "turn.terminal"
    assert messages[-1]["payload"]["assistant_text"] == "json mode"
    session_id = messages[0]["session_id"]
    assert result.stderr.splitlines() == [f"magi-code: session {session_id}"]


def test_doctor_names_what_blocks_a_turn_and_passes_when_one_can_run(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    (home / "settings.json").write_text('{"provider": "anthropic",\n  "model": }')
    broken = magi(home, "doctor", cwd=project)
    assert broken.returncode == 1
    assert "global settings" in broken.stdout and "line 2, column" in broken.stdout
    write_settings(home, fake)
    report = json.loads(magi(home, "doctor", "--json", cwd=project).stdout)
    assert report["turn_ready"] is True, report
    assert {c["check"] for c in report["checks"]} >= {
        "platform",
        "mc_home",
        "settings",
        "selection",
    }
    (home / "settings.json").write_text(json.dumps({"provider": "anthropic", "model": "m"}))
    missing = json.loads(magi(home, "doctor", "--json", cwd=project).stdout)
    assert missing["turn_ready"] is False
    (fail,) = [c for c in missing["checks"] if c["status"] == "fail"]
    assert fail["check"] == "credentials" and "magi-code login" in fail["remedy"]
    assert magi(home, "doctor", cwd=project).returncode == 1
    # A project file's servers in an untrusted project: said, not failed.
    write_settings(home, fake)
    (project / ".magi-code").mkdir()
    servers = {"mcp_servers": {"repo": {"command": "/bin/true"}}}
    (project / ".magi-code" / "settings.json").write_text(json.dumps(servers))
    report = json.loads(magi(home, "doctor", "--json", cwd=project).stdout)
    (trust,) = [c for c in report["checks"] if c["check"] == "trust"]
    assert trust["status"] == "warn" and "mcp_servers" in trust["detail"]
    assert report["turn_ready"] is True
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["hooks"]["detail"] == "none configured"
    assert checks["skills"]["detail"] == "none found"


def test_doctor_lists_the_hooks_and_skills_a_turn_here_gets(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    hooks = {
        "stop": [{"command": ["/usr/local/bin/notify", "--quiet"]}],
        "pre_tool_use": [{"command": ["guard"], "matcher": "shell"}],
    }
    write_settings(home, fake, hooks=hooks)
    skill = project / ".magi-code" / "skills" / "release"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: release\ndescription: Ship it.\n---\nSteps.\n")
    (project / ".magi-code" / "settings.json").write_text(
        json.dumps({"hooks": {"stop": [{"command": ["project-notify"]}]}})
    )
    report = json.loads(magi(home, "doctor", "--json", cwd=project).stdout)
    checks = {c["check"]: c for c in report["checks"]}
    # The untrusted project's hook is not counted: a turn here does not run it.
    assert (
        checks["hooks"]["detail"] == "a turn here runs 2: guard (pre_tool_use shell), notify (stop)"
    )
    assert checks["skills"]["detail"] == "1: release (project)"
    assert checks["trust"]["status"] == "warn" and "hooks" in checks["trust"]["detail"]
    text = magi(home, "doctor", cwd=project).stdout
    assert "guard (pre_tool_use shell), notify (stop)" in text and "release (project)" in text


def test_doctor_says_which_sandbox_a_turn_here_gets_and_why_it_cannot(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    checks = {c["check"]: c for c in json.loads(magi(home, "doctor", "--json").stdout)["checks"]}
    assert checks["sandbox"]["status"] == "ok" and checks["sandbox"]["detail"].startswith("none")
    # The project asks for the sandbox; this bwrap cannot start one.
    (project / ".magi-code").mkdir()
    (project / ".magi-code" / "settings.json").write_text('{"sandbox": "workspace_write"}')
    broken = magi(home, "doctor", "--json", cwd=project, extra={"MC_BWRAP": "/bin/false"})
    report = json.loads(broken.stdout)
    (fail,) = [c for c in report["checks"] if c["status"] == "fail"]
    assert fail["check"] == "sandbox" and report["turn_ready"] is False, report
    assert fail["detail"] == (
        "workspace_write is asked for, but bwrap cannot start a sandbox here "
        "(user namespaces unavailable?)"
    )
    assert fail["remedy"] == REMEDIES["sandbox_unavailable"]


@pytest.mark.parametrize("api", APIS)
def test_doctor_network_reports_a_rejected_key_from_the_model_list(
    home: Path, project: Path, fake: FakeProviderServer, api: str
) -> None:
    env = builtin_env(home, fake, api)
    accepted = magi(home, "doctor", "--network", "--json", extra=env, cwd=project)
    report = json.loads(accepted.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert report["turn_ready"] is True, report
    assert checks["network"]["status"] == "ok"
    assert checks["network"]["detail"].endswith(f"accepted ({len(fake.models)} models listed)")
    (listing,) = fake.requests
    assert listing.method == "GET" and listing.path.endswith("/models")
    credential = {"anthropic": "x-api-key", "openai-responses": "authorization"}.get(api)
    if credential is not None:  # the request carried the credentials a turn sends
        assert listing.headers[credential]

    fake.listing_reply = HttpError(401, {"error": {"type": "authentication_error"}})
    rejected = magi(home, "doctor", "--network", extra=env, cwd=project)
    assert rejected.returncode == 1
    (line,) = [x for x in rejected.stdout.splitlines() if x.startswith("fail  network")]
    assert "the provider rejected the credentials (HTTP 401)" in line
    assert rejected.stdout.endswith("magi-code doctor: a turn cannot run here yet\n")
    assert "a turn can run here\n" not in rejected.stdout
    for secret in ("sk-ant-test-key-0000", "refresh-fake"):
        assert secret not in rejected.stdout + rejected.stderr

    fake.listing_reply = HttpError(403, {"error": {"type": "permission_error"}})
    forbidden = json.loads(magi(home, "doctor", "--network", "--json", extra=env).stdout)
    (network,) = [c for c in forbidden["checks"] if c["check"] == "network"]
    assert forbidden["turn_ready"] is False and network["status"] == "fail"
    assert "(HTTP 403)" in network["detail"]


def test_doctor_network_reports_other_failures_for_what_they_are(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    env = builtin_env(home, fake, "anthropic")
    fake.listing_reply = HttpError(404)
    report = json.loads(magi(home, "doctor", "--network", "--json", extra=env).stdout)
    (network,) = [c for c in report["checks"] if c["check"] == "network"]
    assert network["status"] == "warn" and "got HTTP 404" in network["detail"]
    assert "not confirmed" in network["detail"] and report["turn_ready"] is True
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        unreachable = {**env, "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{closed.getsockname()[1]}"}
        report = json.loads(magi(home, "doctor", "--network", "--json", extra=unreachable).stdout)
    (network,) = [c for c in report["checks"] if c["check"] == "network"]
    assert network["status"] == "fail" and "cannot reach its endpoint" in network["detail"]
    assert report["turn_ready"] is False


def test_protocol_schema_prints_the_bundle_and_writes_files(home: Path, tmp_path: Path) -> None:
    bundle = json.loads(magi(home, "protocol", "schema").stdout)
    assert bundle == schema_documents()["v1"]
    out = tmp_path / "schemas"
    assert magi(home, "protocol", "schema", "--out", str(out)).returncode == 0
    assert any(out.glob("*.json"))


def test_protocol_schema_consumer_prints_the_consumer_bundle(home: Path, tmp_path: Path) -> None:
    printed = magi(home, "protocol", "schema", "--consumer")
    assert printed.returncode == 0
    bundle = json.loads(printed.stdout)
    assert bundle == schema_documents("consumer")["v1"] != schema_documents()["v1"]
    assert bundle["$id"] == "urn:magi-code:protocol:v1:consumer"
    out = tmp_path / "consumer"
    assert magi(home, "protocol", "schema", "--consumer", "--out", str(out)).returncode == 0
    assert json.loads((out / "v1.json").read_text()) == bundle
