"""``magi-code grants list|revoke``: the approval grants of this project, from a terminal.

Two kinds of grant live in two places (``docs/safety.md``):

- **project grants** are the allow rules in the project settings file
  (``.magi-code/settings.json``, where "allow always for this project" answers are
  written; they count only in a trusted project). They are read and removed in that file
  itself (``config.grants``), whether or not a daemon runs; a running daemon reads the
  file for every turn, so a removed rule is not honoured from the next call on.
- **session grants** ("allow for this session" answers) are stored with the session
  (its metadata, ``sessions.meta``), so they outlive the daemon. While a daemon runs they
  are listed and removed through it (a ``persistent`` connection that does not ask a
  daemon of another build to make way), so a removal counts for a turn running there
  from its next call on; with no daemon running, in the session store itself, as the
  daemon would (``core.approvals``).

Exit status: 0; 1 when the grant to revoke is not there, the daemon cannot be asked, or
the project settings cannot be read or written; 2 for a usage error.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Any, Final

import orjson

from magi_code.client.errors import DaemonError, DaemonUnavailable
from magi_code.client.handshake import answer_timeout
from magi_code.config.grants import project_grants, revoke_project_grant
from magi_code.core.approvals import ApprovalService
from magi_code.protocol.errors import ServiceError
from magi_code.protocol.text import without_hidden
from magi_code.protocol.v2 import GRANT_KINDS
from magi_code.sessions.store import SessionStore
from magi_code.storage.launch import LaunchContext

EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
CLIENT_NAME: Final = "magi-code grants"
LABELS: Final = {"commands": "command", "tools": "tool", "paths": "path"}


def _fail(message: str, code: int = EXIT_FAILURE) -> int:
    sys.stderr.write(f"magi-code: {message}\n")
    return code


def main(
    ctx: LaunchContext,
    action: str,
    *,
    session_id: str | None,
    project: bool = False,
    kind: str | None = None,
    words: Sequence[str] = (),
    as_json: bool = False,
) -> int:
    if action == "list":
        return list_grants(ctx, session_id, as_json=as_json)
    assert kind in GRANT_KINDS
    if kind != "commands" and len(words) != 1:
        return _fail(f"a {LABELS[kind]} grant is one value", EXIT_USAGE)
    value: tuple[str, ...] | str = tuple(words) if kind == "commands" else words[0]
    if project:
        return _revoke_project(ctx, kind, value)
    assert session_id is not None
    return _revoke_session(ctx, session_id, kind, value)


def list_grants(ctx: LaunchContext, session_id: str | None, *, as_json: bool) -> int:
    rules, honoured = project_grants(ctx)
    session: dict[str, Any] | None = None
    if session_id is not None:
        try:
            session = asyncio.run(_session_grants(ctx, session_id))
        except DaemonUnavailable:
            try:
                session = asyncio.run(_stored(ctx).grants(ctx, session_id))["session"]
            except ServiceError as exc:
                return _fail(f"the session's grants cannot be read ({exc.code.value})")
        except DaemonError as exc:
            return _fail(f"the daemon cannot be asked: {exc}")
    if as_json:
        document = {"project": rules.as_document(), "project_honoured": honoured}
        document["session"] = session
        sys.stdout.write(orjson.dumps(document).decode() + "\n")
        return 0
    state = "honoured: the project is trusted" if honoured else "not honoured: not trusted"
    sys.stdout.write(f"project grants ({state}):\n")
    _write_rules(rules.as_document())
    if session is not None:
        sys.stdout.write(f"session {session_id} grants:\n")
        _write_rules(session)
    return 0


def _write_rules(document: dict[str, list[Any]]) -> None:
    lines = [
        f"  {LABELS[kind]:<8} {' '.join(entry) if kind == 'commands' else entry}"
        for kind in GRANT_KINDS
        for entry in document[kind]
    ]
    for line in lines or ["  (none)"]:
        sys.stdout.write(without_hidden(line) + "\n")


def _revoke_project(ctx: LaunchContext, kind: str, value: tuple[str, ...] | str) -> int:
    try:
        removed = revoke_project_grant(ctx, kind, value)
    except ServiceError as exc:
        return _fail(f"the project settings cannot be changed ({exc.code.value})")
    if not removed:
        return _fail("no such project grant")
    sys.stdout.write("revoked\n")
    return 0


def _revoke_session(
    ctx: LaunchContext, session_id: str, kind: str, value: tuple[str, ...] | str
) -> int:
    try:
        removed = asyncio.run(_revoke_in_daemon(ctx, session_id, kind, value))
    except DaemonUnavailable:
        try:
            removed = asyncio.run(_stored(ctx).revoke_session(session_id, kind, value))
        except ServiceError as exc:
            return _fail(f"the session's grants cannot be changed ({exc.code.value})")
    except DaemonError as exc:
        return _fail(f"the daemon cannot be asked: {exc}")
    if not removed:
        return _fail("no such session grant")
    sys.stdout.write("revoked\n")
    return 0


def _stored(ctx: LaunchContext) -> ApprovalService:
    """The grants as the daemon keeps them, read and changed here (no daemon runs)."""
    return ApprovalService(SessionStore(ctx.sessions_dir))


async def _client(ctx: LaunchContext) -> Any:
    """A persistent client of this home's daemon that never asks it to make way."""
    from magi_code.client import Channel, Client, socket_for

    channel = await Channel.open(
        socket_for(ctx), "persistent", ctx, client_name=CLIENT_NAME, timeout=answer_timeout(ctx.env)
    )
    return Client(channel)


async def _bounded(ctx: LaunchContext, call: Any) -> Any:
    try:
        return await asyncio.wait_for(call, answer_timeout(ctx.env))
    except TimeoutError:
        raise DaemonError("it did not answer in time") from None


async def _session_grants(ctx: LaunchContext, session_id: str) -> dict[str, Any]:
    client = await _client(ctx)
    try:
        grants = await _bounded(ctx, client.grants_list(session_id))
    finally:
        await client.close()
    session: dict[str, Any] = grants["session"]
    return session


async def _revoke_in_daemon(
    ctx: LaunchContext, session_id: str, kind: str, value: tuple[str, ...] | str
) -> bool:
    client = await _client(ctx)
    try:
        before = (await _bounded(ctx, client.grants_list(session_id)))["session"]
        entry = list(value) if kind == "commands" else value
        if entry not in before[kind]:
            return False
        await _bounded(ctx, client.grants_revoke("session", kind, value, session_id=session_id))
        return True
    finally:
        await client.close()
