"""``magi-code --app acp`` driven by the official ACP Python SDK, in both service modes.

The agent runs turns on the loopback provider fake; every message it writes is validated
against the SDK's ACP v1 models (``acp_support.Editor``). The same sessions are seen by a
v1 frontend, and a turn a v1 frontend ran is streamed back by ``session/load``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import orjson
import pytest
from acp import schema
from acp.exceptions import RequestError

from tests.process.acp_support import BufferEditor, acp_agent, text_prompt, texts, tool_calls
from tests.process.turn_support import (
    replay_all,
    run_turn,
    tool_call,
    tool_reply,
    write_settings,
)
from tests.support.fake_oauth import FakeOAuthIssuer
from tests.support.fake_providers import FakeProviderServer, HttpError, Reply
from tests.support.service import running_service, service_env, spawn

# Both modes: the ACP agent reaches the core through the daemon or in-process.
pytestmark = pytest.mark.both_modes


async def test_initialize_negotiates_v1_and_states_what_is_supported(
    home: Path, project: Path
) -> None:
    async with acp_agent(home, project) as (conn, _editor):
        answer = await conn.initialize(protocol_version=1)
        assert answer.protocol_version == 1
        caps = answer.agent_capabilities
        assert caps is not None and caps.load_session is True
        assert caps.prompt_capabilities is not None
        assert caps.prompt_capabilities.embedded_context is True
        assert caps.prompt_capabilities.image is False
        assert caps.session_capabilities is not None and caps.session_capabilities.list is not None
        assert {m.id for m in answer.auth_methods or []} == {"api-key", "codex-login"}
        # A client asking for a later version is told the one this agent speaks.
        assert (await conn.initialize(protocol_version=7)).protocol_version == 1


async def test_a_prompt_streams_tool_calls_and_text_and_a_v1_frontend_sees_the_session(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake, "openai-responses")  # its summaries are verified ones
    fake.enqueue(
        tool_reply(tool_call("c1", "write_file", path="notes.txt", content="hello\n")),
        Reply(text=("Wrote ", "notes.txt."), reasoning_summary="Writing the file first."),
    )
    async with acp_agent(home, project) as (conn, editor):
        await conn.initialize(protocol_version=1)
        session_id = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        context = schema.EmbeddedResourceContentBlock(
            type="resource",
            resource=schema.TextResourceContents(
                uri=f"file://{project}/README.md", text="Project rules: be brief."
            ),
        )
        answer = await conn.prompt(
            session_id=session_id, prompt=[*text_prompt("Write notes.txt"), context]
        )
        assert answer.stop_reason == "end_turn"
        assert (project / "notes.txt").read_text() == "hello\n"
        started = [u for u in editor.updates if u["sessionUpdate"] == "tool_call"]
        assert [(u["kind"], u["title"], u["status"]) for u in started] == [
            ("edit", "Write file: notes.txt", "in_progress")
        ]
        ended = [
            u for u in editor.updates if u["sessionUpdate"] == "tool_call_update" and "status" in u
        ]
        assert [(u["toolCallId"], u["status"]) for u in ended] == [
            (started[0]["toolCallId"], "completed")
        ]
        (written,) = tool_calls(editor.updates).values()
        notes = str(project / "notes.txt")
        assert written["content"] == [
            {"type": "diff", "path": notes, "oldText": None, "newText": "hello\n"}
        ]
        assert texts(editor.updates, "agent_message_chunk") == "Wrote notes.txt."
        assert texts(editor.updates, "agent_thought_chunk") == "Writing the file first."
        assert any(u["sessionUpdate"] == "usage_update" for u in editor.updates)
        # The embedded resource reached the model as context.
        assert "Project rules: be brief." in fake.requests[0].body.decode()

    async with running_service(home, project) as v1:
        listed = await v1.request("session.list", {})
        assert session_id in [s["session_id"] for s in listed["payload"]["sessions"]]
        items = await replay_all(v1, session_id)
        assert items[-2]["role"] == "assistant" and items[-2]["text"] == "Wrote notes.txt."


async def test_tool_calls_carry_locations_and_an_edit_its_diff(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    source = project / "app.py"
    source.write_text("x = 1\ny = 2\n")
    fake.enqueue(
        tool_reply(tool_call("c1", "read_file", path="app.py", offset=2)),
        tool_reply(
            tool_call("c2", "edit_file", path="app.py", old_string="x = 1", new_string="x = 10")
        ),
        Reply(text=("Done.",)),
    )
    async with acp_agent(home, project) as (conn, editor):
        await conn.initialize(protocol_version=1)
        session_id = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        answer = await conn.prompt(session_id=session_id, prompt=text_prompt("Change x"))
        assert answer.stop_reason == "end_turn"
    assert source.read_text() == "x = 10\ny = 2\n"
    read, edit = tool_calls(editor.updates).values()
    assert (read["kind"], read["title"], read["status"]) == (
        "read",
        "Read file: app.py",
        "completed",
    )
    assert read["locations"] == [{"path": str(source), "line": 2}]
    assert read["rawInput"] == {"path": "app.py", "offset": 2}
    assert (edit["kind"], edit["title"], edit["status"]) == (
        "edit",
        "Edit file: app.py",
        "completed",
    )
    assert edit["locations"] == [{"path": str(source)}]
    assert edit["content"] == [
        {
            "type": "diff",
            "path": str(source),
            "oldText": "x = 1\ny = 2\n",
            "newText": "x = 10\ny = 2\n",
        }
    ]


async def test_file_tools_read_and_write_through_the_editor_when_it_offers_them(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    source = project / "app.py"
    source.write_text("x = 1\n")
    created = project / "new.txt"
    # The editor has app.py open with a change it has not saved.
    editor = BufferEditor({str(source): "x = 1\nunsaved = True\n"})
    fake.enqueue(
        tool_reply(tool_call("c1", "read_file", path="app.py")),
        tool_reply(
            tool_call("c2", "edit_file", path="app.py", old_string="x = 1", new_string="x = 2")
        ),
        tool_reply(tool_call("c3", "write_file", path="new.txt", content="fresh\n")),
        Reply(text=("Done.",)),
    )
    offers = schema.ClientCapabilities(
        fs=schema.FileSystemCapabilities(read_text_file=True, write_text_file=True)
    )
    async with acp_agent(home, project, editor=editor) as (conn, _editor):
        await conn.initialize(protocol_version=1, client_capabilities=offers)
        session_id = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        answer = await conn.prompt(session_id=session_id, prompt=text_prompt("Edit app.py"))
        assert answer.stop_reason == "end_turn"
    # The read saw the unsaved buffer; the edit and the new file went to the editor only.
    assert "unsaved = True" in fake.requests[1].body.decode()
    assert editor.buffers == {str(source): "x = 2\nunsaved = True\n", str(created): "fresh\n"}
    assert source.read_text() == "x = 1\n" and not created.exists()
    assert ("write", str(source)) in editor.file_calls
    edit = list(tool_calls(editor.updates).values())[1]
    assert edit["content"][0]["oldText"] == "x = 1\nunsaved = True\n"
    assert edit["content"][0]["newText"] == "x = 2\nunsaved = True\n"


async def test_load_streams_back_the_history_including_a_v1_frontends_turn(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(
        tool_reply(tool_call("c1", "write_file", path="notes.txt", content="hi\n")),
        Reply(text=("first answer",)),
        tool_reply(tool_call("c2", "read_file", path="missing.txt")),
        Reply(text=("v1 answer",)),
    )
    async with acp_agent(home, project) as (conn, _editor):
        await conn.initialize(protocol_version=1)
        session_id = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        await conn.prompt(session_id=session_id, prompt=text_prompt("first question"))
    async with running_service(home, project) as v1:
        await run_turn(v1, "v1 question", session_id=session_id)

    async with acp_agent(home, project) as (conn, editor):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(project), session_id=session_id, mcp_servers=[])
        history = [
            (u["sessionUpdate"], u["content"]["text"])
            if u["sessionUpdate"] != "tool_call"
            else ("tool_call", u["kind"], u["title"], u["status"])
            for u in editor.updates
            if u["sessionUpdate"] in ("user_message_chunk", "agent_message_chunk", "tool_call")
        ]
        assert history == [
            ("user_message_chunk", "first question"),
            ("tool_call", "edit", "Write file: notes.txt", "completed"),
            ("agent_message_chunk", "first answer"),
            ("user_message_chunk", "v1 question"),
            ("tool_call", "read", "Read file: missing.txt", "failed"),
            ("agent_message_chunk", "v1 answer"),
        ]
        replayed = [u for u in editor.updates if u["sessionUpdate"] == "tool_call"]
        assert replayed[0]["rawInput"] == {"path": "notes.txt", "content": "hi\n"}
        assert replayed[0]["locations"] == [{"path": str(project / "notes.txt")}]
        assert replayed[0]["content"] == [
            {"type": "content", "content": {"type": "text", "text": "Completed."}}
        ]
        assert len({u["toolCallId"] for u in replayed}) == 2
        listed = await conn.list_sessions()
        assert session_id in [s.session_id for s in listed.sessions]
        with pytest.raises(RequestError) as missing:
            await conn.load_session(cwd=str(project), session_id="ses_nothere", mcp_servers=[])
        assert missing.value.code == -32002


async def test_cancel_ends_the_prompt_cancelled(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=("partial",), ending="stall"))
    async with acp_agent(home, project) as (conn, editor):
        await conn.initialize(protocol_version=1)
        session_id = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        prompt = asyncio.create_task(conn.prompt(session_id=session_id, prompt=text_prompt("go")))
        await editor.wait_for(lambda u: u["sessionUpdate"] == "agent_message_chunk")
        await conn.cancel(session_id=session_id)
        answer = await asyncio.wait_for(prompt, 60)
        assert answer.stop_reason == "cancelled"


async def test_a_failed_turn_is_an_error_with_the_failure_label(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(HttpError(401))
    async with acp_agent(home, project) as (conn, _editor):
        await conn.initialize(protocol_version=1)
        session_id = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        with pytest.raises(RequestError) as failed:
            await conn.prompt(session_id=session_id, prompt=text_prompt("hi"))
        assert failed.value.code == -32000  # ACP's auth_required
        assert isinstance(failed.value.data, dict)
        assert failed.value.data["failure"] == "provider_auth_failed"


async def test_bad_input_gets_json_rpc_errors_and_the_agent_goes_on(
    home: Path, project: Path
) -> None:
    proc = await spawn(project, service_env(home), ("--app", "acp"))
    assert proc.stdin is not None and proc.stdout is not None
    lines = [
        b"not json",
        b"[1, 2]",
        b'{"jsonrpc": "2.0", "id": 1, "method": "no/such"}',
        b'{"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"protocolVersion": "x"}}',
        b'{"jsonrpc": "2.0", "id": 3, "method": "session/new", "params": {"cwd": "rel"}}',
        b'{"jsonrpc": "2.0", "id": 4, "method": "session/prompt", "params": {}}',
        b'{"jsonrpc": "2.0", "method": "no/such/notification"}',
        b'{"jsonrpc": "2.0", "id": 5, "method": "x", "params": "' + b"a" * (9 << 20) + b'"}',
        b'{"jsonrpc": "2.0", "id": 6, "method": "initialize", "params": {"protocolVersion": 1}}',
    ]
    proc.stdin.write(b"\n".join(lines) + b"\n")
    await proc.stdin.drain()
    answers = [orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 60)) for _ in range(8)]
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    # Requests run concurrently: their answers may come in any order.
    codes = sorted((str(a["id"]), a["error"]["code"]) for a in answers if "error" in a)
    assert codes == sorted(
        [
            ("None", -32700),
            ("None", -32600),
            ("1", -32601),
            ("2", -32602),
            ("3", -32602),
            ("4", -32602),
            ("None", -32600),  # the oversized line
        ]
    )
    (ok,) = [a for a in answers if "result" in a]
    assert ok["id"] == 6 and ok["result"]["protocolVersion"] == 1


def _codex_env(issuer: FakeOAuthIssuer, fake: FakeProviderServer, browser: str) -> dict[str, str]:
    return {
        "MC_CODEX_AUTH_ISSUER": issuer.url,
        "MC_OAUTH_CALLBACK_PORT": "0",
        "MC_CODEX_BASE_URL": fake.base_url,
        "BROWSER": browser,  # the browser `authenticate` opens (Python's webbrowser)
    }


async def test_codex_login_without_a_browser_gives_the_address_then_a_codex_prompt_runs(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    (home / "settings.json").write_text(orjson.dumps({"provider": "openai-codex"}).decode())
    fake.enqueue(Reply(text=("codex ", "says hi")))
    with FakeOAuthIssuer(account_id="acct-acp") as issuer:
        async with acp_agent(home, project, _codex_env(issuer, fake, "false")) as (conn, _ed):
            await conn.initialize(protocol_version=1)
            # No browser could be opened ("false" fails): the answer gives the address.
            with pytest.raises(RequestError) as asked:
                await conn.authenticate(method_id="codex-login")
            assert asked.value.code == -32000
            assert isinstance(asked.value.data, dict)
            url = asked.value.data["url"]
            assert url.startswith(issuer.url) and url in str(asked.value)
            # The person opens it elsewhere; the issuer redirects to the loopback listener.
            async with httpx.AsyncClient(follow_redirects=True, timeout=30) as browser:
                assert (await browser.get(url)).status_code == 200
            assert await conn.authenticate(method_id="codex-login") is not None
            session_id = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
            answer = await conn.prompt(session_id=session_id, prompt=text_prompt("hi"))
            assert answer.stop_reason == "end_turn"
    sent = fake.requests[-1]
    assert sent.path.endswith("/responses")
    assert sent.headers["chatgpt-account-id"] == "acct-acp"
    assert [r for r in issuer.requests if r.path.endswith("/token")]


async def test_codex_login_with_a_browser_answers_once_signed_in(
    home: Path, project: Path, fake: FakeProviderServer, tmp_path: Path
) -> None:
    # A "browser" that follows the address to the loopback callback, as a person would.
    # Browsers write to their stdout: it must not be the agent's (the ACP channel), so
    # this one opens nothing unless its standard streams are /dev/null.
    script = tmp_path / "browser.py"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, httpx\n"
        "null = os.stat(os.devnull)\n"
        "if not all(os.path.samestat(os.fstat(fd), null) for fd in (0, 1)):\n"
        "    sys.exit(1)\n"
        "sys.exit(httpx.get(sys.argv[1], follow_redirects=True, timeout=30).status_code != 200)\n"
    )
    script.chmod(0o755)
    with FakeOAuthIssuer() as issuer:
        env = _codex_env(issuer, fake, str(script))
        async with acp_agent(home, project, env) as (conn, _editor):
            await conn.initialize(protocol_version=1)
            assert await conn.authenticate(method_id="codex-login") is not None
            # Ready now: answered from the credential store, no second login.
            assert await conn.authenticate(method_id="codex-login") is not None
    authorizations = [r for r in issuer.requests if "/authorize" in r.path]
    assert len(authorizations) == 1


async def test_a_codex_login_that_fails_is_an_error_with_its_state(
    home: Path, project: Path, fake: FakeProviderServer, tmp_path: Path
) -> None:
    # A "browser" that comes back to the loopback callback with another login's state.
    script = tmp_path / "browser.py"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys, httpx\n"
        "from urllib.parse import parse_qs, urlsplit\n"
        "back = parse_qs(urlsplit(sys.argv[1]).query)['redirect_uri'][0]\n"
        "httpx.get(back, params={'code': 'c0de', 'state': 'not-this-one'}, timeout=30)\n"
    )
    script.chmod(0o755)
    with FakeOAuthIssuer() as issuer:
        async with acp_agent(home, project, _codex_env(issuer, fake, str(script))) as (conn, _e):
            await conn.initialize(protocol_version=1)
            with pytest.raises(RequestError) as failed:
                await conn.authenticate(method_id="codex-login")
    assert failed.value.code == -32000
    assert failed.value.data == {"state": "callback_failed"}
    assert not (home / "auth.json").exists()
