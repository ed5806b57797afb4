"""kill -9 of the daemon at random moments during turns loses nothing acknowledged.

Each trial: a persistent client runs one to three lanes (a lane is one session with
turns one after another) against a slowly streaming loopback provider; the daemon is
SIGKILLed at a random moment. A new client (which starts a new daemon) then asks for
every accepted turn's outcome by session (RFC-0002 §6, ``finished`` from history), and a
fresh v1 shim lists and replays every session: each history parses, every accepted turn
has its user record, every terminal the client saw is in replay with the same text.
Sessions of earlier trials are checked again after every later kill.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from magi_code.client import Client, DaemonError, DaemonUnavailable, OutcomeUnknown, Overloaded
from tests.process.daemon.support import context, status
from tests.process.turn_support import replay_all, write_settings
from tests.stress.support import (
    TIMEOUT,
    EchoProvider,
    daemon_log,
    daemon_running,
    last_user_text,
    report,
    rng,
    scaled,
    tracebacks,
    wait_until,
)
from tests.support.service import ServiceProcess

pytestmark = pytest.mark.timeout(TIMEOUT)

TURNS_PER_LANE = 5
CHUNKS = 12
CHUNK_DELAY = 0.03  # about 0.4 s of streaming per turn


@dataclass
class Turn:
    prompt: str
    turn_id: str
    session_id: str
    seen: dict[str, Any] | None = None  # the terminal payload the first client saw
    outcome: dict[str, Any] | None = None  # the terminal answered after the kill


@dataclass
class Lane:
    name: str
    turns: list[Turn] = field(default_factory=list)
    resumed: bool = False  # its last start's outcome was unknown and it was resumed

    @property
    def session_id(self) -> str | None:
        return self.turns[0].session_id if self.turns else None


class Run:
    """One trial's client: lanes of turns and one task taking every event."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.terminals: dict[str, dict[str, Any]] = {}
        self.ended = asyncio.Event()
        self.changed = asyncio.Event()
        # turn.start requests whose outcome the connection's end hid, by lane
        self.unknown: list[tuple[Lane, OutcomeUnknown]] = []
        self.reader = asyncio.create_task(self._events())

    async def _events(self) -> None:
        try:
            async for event in self.client.events():
                if isinstance(event, Overloaded):
                    attached = await self.client.attach(event.turn_id, event.after_sequence)
                    for envelope in attached["events"]:
                        self._take(dict(envelope))
                else:
                    self._take(dict(event))
        except (DaemonError, DaemonUnavailable, ConnectionError, OSError):
            pass
        finally:
            self.ended.set()
            self.changed.set()

    def _take(self, event: dict[str, Any]) -> None:
        if event.get("event") == "turn.terminal":
            payload = event["payload"]
            self.terminals[payload["turn_id"]] = payload
            self.changed.set()

    async def terminal(self, turn_id: str) -> dict[str, Any] | None:
        while turn_id not in self.terminals and not self.ended.is_set():
            self.changed.clear()
            await self.changed.wait()
        return self.terminals.get(turn_id)

    async def lane(self, lane: Lane) -> None:
        for k in range(TURNS_PER_LANE):
            prompt = f"{lane.name}-k{k}"
            try:
                response = await self.client.request(
                    "turn.start", {"prompt": prompt}, session_id=lane.session_id
                )
            except OutcomeUnknown as exc:
                self.unknown.append((lane, exc))
                return
            except (DaemonError, DaemonUnavailable, ConnectionError, OSError):
                return
            if response["error"] is not None:
                raise AssertionError(f"turn.start refused before the kill: {response}")
            payload = response["payload"]
            turn = Turn(prompt, payload["turn_id"], payload["session_id"])
            lane.turns.append(turn)
            turn.seen = await self.terminal(turn.turn_id)
            if turn.seen is None:
                return

    async def close(self) -> None:
        await self.client.close()
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reader


async def _persistent(home: Path, project: Path) -> Client:
    client = await Client.connect(context(home, project), "persistent")
    init = await client.request("initialize", {"supported_protocol_versions": [1]})
    assert init["error"] is None, init
    return client


def _turns_in_replay(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replay items as turns: a user message, its assistant text, its terminal status."""
    turns: list[dict[str, Any]] = []
    for item in items:
        if item["kind"] == "message" and item["role"] == "user":
            turns.append({"prompt": item["text"], "text": "", "status": None})
        elif item["kind"] == "message":
            assert turns, items
            turns[-1]["text"] += item["text"]
        elif item["kind"] == "terminal":
            assert turns and turns[-1]["status"] is None, items
            turns[-1]["status"] = item["status"]
    return turns


def _check_lane(lane: Lane, items: list[dict[str, Any]]) -> None:
    replayed = _turns_in_replay(items)
    # At most one more user record than acknowledged starts: a start the kill cut off.
    # A resumed start ran once: its user record is there exactly once.
    most = len(lane.turns) + (0 if lane.resumed else 1)
    assert len(lane.turns) <= len(replayed) <= most, (lane, replayed)
    for turn, got in zip(lane.turns, replayed, strict=False):
        assert got["prompt"] == turn.prompt, (turn, got)
        assert turn.outcome is not None
        assert got["status"] == turn.outcome["status"], (turn, got)
        assert got["text"] == turn.outcome["assistant_text"], (turn, got)
        if turn.seen is not None:
            assert got["status"] == turn.seen["status"], (turn, got)
            assert got["text"] == turn.seen["assistant_text"], (turn, got)


async def _list_sessions(svc: ServiceProcess) -> list[str]:
    ids: list[str] = []
    after = None
    for _ in range(1000):
        payload: dict[str, Any] = {} if after is None else {"after": after}
        listed = await svc.request("session.list", payload)
        assert listed["error"] is None, listed
        ids += [s["session_id"] for s in listed["payload"]["sessions"]]
        if not listed["payload"]["truncated"]:
            return ids
        after = listed["payload"]["next_after"]
    raise AssertionError("session.list did not end")


async def test_kill_9_at_random_points_during_turns(home: Path, project: Path) -> None:
    r = rng("kill9")
    trials = scaled(4, 24)
    lanes: list[Lane] = []
    figures = {
        "accepted": 0,
        "terminals_seen": 0,
        "recovered": 0,
        "unknown_starts": 0,
        "resumed": 0,
    }
    replays = 0
    with EchoProvider(CHUNKS, CHUNK_DELAY) as fake:
        write_settings(home, fake)
        for trial in range(trials):
            run = Run(await _persistent(home, project))
            pid = (await asyncio.to_thread(status, home))["pid"]
            trial_lanes = [Lane(f"t{trial}-l{j}") for j in range(r.randint(1, 3))]
            lanes += trial_lanes
            tasks = [asyncio.create_task(run.lane(lane)) for lane in trial_lanes]
            await asyncio.sleep(r.uniform(0.05, 2.5))
            os.kill(pid, signal.SIGKILL)
            await wait_until(lambda: not daemon_running(home), 30, "the killed daemon to go")
            done, pending = await asyncio.wait(tasks, timeout=60)
            assert not pending, "a lane did not notice the connection's end"
            for task in done:
                task.result()
            await run.close()
            figures["unknown_starts"] += len(run.unknown)

            # A new client starts a new daemon and asks for every outcome by session.
            checker = Run(await _persistent(home, project))
            try:
                # A start whose answer the kill hid, on a known session, is repeated with
                # its idempotency key (RFC-0002 §6.5): the original turn, or a first run.
                for lane, lost in run.unknown:
                    if lost.session_id is None:
                        continue  # "a new session": no later daemon can recognize it
                    response, attached = await checker.client.resume_turn(lost)
                    assert response["error"] is None and attached is not None, response
                    turn = Turn(lost.payload["prompt"], attached["turn_id"], lost.session_id)
                    if attached["status"] != "finished":
                        assert await checker.terminal(turn.turn_id) is not None
                    lane.turns.append(turn)
                    lane.resumed = True
                    figures["resumed"] += 1
                for lane in trial_lanes:
                    for turn in lane.turns:
                        answer = await checker.client.attach(
                            turn.turn_id, -1, session_id=turn.session_id
                        )
                        assert answer["status"] == "finished", (turn, answer)
                        assert answer["events"][-1]["event"] == "turn.terminal", answer
                        turn.outcome = dict(answer["events"][-1]["payload"])
                        assert turn.outcome["turn_id"] == turn.turn_id
                        if turn.seen is None:
                            figures["recovered"] += 1
                        else:
                            assert turn.outcome["status"] == turn.seen["status"], turn
                            assert turn.outcome["assistant_text"] == turn.seen["assistant_text"]
                        figures["accepted"] += 1
                        figures["terminals_seen"] += turn.seen is not None
            finally:
                await checker.close()

            # A fresh v1 shim: every session (of every trial so far) lists and replays.
            svc = await ServiceProcess.start(home, project)
            try:
                await svc.initialize()
                listed = await _list_sessions(svc)
                known = {lane.session_id for lane in lanes if lane.session_id}
                assert known <= set(listed), known - set(listed)
                by_session = {}
                for session_id in listed:
                    try:
                        by_session[session_id] = await replay_all(svc, session_id)
                    except AssertionError as exc:  # with what the daemon logged
                        problems = tracebacks(daemon_log(home))
                        raise AssertionError("\n".join([str(exc), *problems])) from None
                    replays += 1
                for lane in lanes:
                    if lane.session_id is not None:
                        _check_lane(lane, by_session[lane.session_id])
            finally:
                await svc.close_stdin()
                await svc.wait()
            log = daemon_log(home)
            assert "Traceback" not in log, "\n".join(tracebacks(log))
    # No prompt reached the provider twice (a resumed start never ran again).
    prompts = collections.Counter(
        last_user_text(req.json) for req in fake.requests if req.method == "POST"
    )
    repeated = {p: n for p, n in prompts.items() if n > 1}
    assert not repeated, repeated
    report(
        "kill9",
        trials=trials,
        kills=trials,
        sessions=len(listed),
        replays=replays,
        **figures,
        provider_requests=sum(prompts.values()),
    )
