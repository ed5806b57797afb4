"""The daemon's roles and persistent coordinator driven directly over the in-memory transport.

Real domains, real session files under the test's MC_HOME and a real loopback provider;
no socket and no process. Frames are read and written raw (RFC-0002), so these tests pin
the wire behaviour, not a client library's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import orjson
import pytest
from tests.process.turn_support import write_settings
from tests.support.fake_providers import FakeProviderServer, Reply
from tests.support.inprocess import InMemoryDaemon, in_memory_daemon
from tests.support.v2peer import Frame, Peer, sequences

from magi_code.core.persistent import RECOVERED_SEQUENCE
from magi_code.daemon import persistent_role
from magi_code.protocol import envelope
from magi_code.protocol.frames import MAX_FRAME_BYTES
from magi_code.sessions.store import SessionStore


async def _peer(daemon: InMemoryDaemon) -> Peer:
    return await Peer.over(await daemon.channel("persistent"))


async def test_a_turns_events_follow_its_acceptance_in_sequence_order(
    daemon: InMemoryDaemon, fake: FakeProviderServer
) -> None:
    fake.enqueue(Reply(text=["a", "b", "c"]))
    peer = await _peer(daemon)
    rid = await peer.send_request("turn.start", {"prompt": "hi"})
    frames: list[Frame] = []
    while not frames or frames[-1]["message"].get("event") != "turn.terminal":
        frames.append(await peer.until(lambda f: f["t"] == "message"))
    messages = [f["message"] for f in frames]
    assert messages[0]["kind"] == "response" and messages[0]["request_id"] == rid
    turn_id = messages[0]["payload"]["turn_id"]
    events = messages[1:]
    assert events[0]["event"] == "turn.started" and events[-1]["event"] == "turn.terminal"
    assert sequences(events) == list(range(len(events)))  # one counter, no gap
    deltas = [e["payload"]["text"] for e in events if e["event"] == "turn.assistant_delta"]
    assert deltas == ["a", "b", "c"]
    assert all(e["request_id"] == rid and e["payload"]["turn_id"] == turn_id for e in events)
    assert events[-1]["payload"]["assistant_text"] == "abc"
    await peer.close()


async def test_a_second_client_attached_mid_turn_gets_buffered_then_live_events_once(
    daemon: InMemoryDaemon, fake: FakeProviderServer
) -> None:
    chunks = [f"c{i} " for i in range(30)]
    fake.enqueue(Reply(text=chunks, chunk_delay=0.01))
    owner, follower = await _peer(daemon), await _peer(daemon)
    response = await owner.request("turn.start", {"prompt": "go"})
    turn_id = response["payload"]["turn_id"]
    await owner.until(
        lambda f: f["t"] == "message" and f["message"].get("payload", {}).get("sequence") == 3
    )
    answer, buffered = await follower.attach(turn_id, 1)
    assert answer["status"] == "attached"
    live = await follower.turn_events(turn_id)
    seen = sequences(buffered) + sequences(live)
    assert seen == list(range(2, seen[-1] + 1))  # gapless, each once, in order
    assert live[-1]["payload"]["assistant_text"] == "".join(chunks)
    # The owner, attached to its own turn too, still receives each event once.
    await owner.attach(turn_id, 3)
    rest = await owner.turn_events(turn_id)
    assert len(sequences(rest)) == len(set(sequences(rest)))
    await owner.close()
    await follower.close()


async def test_a_512_event_attach_arrives_in_parts_in_order_before_live_events(
    daemon: InMemoryDaemon, fake: FakeProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(persistent_role, "ATTACH_PART_BYTES", 8 * 1024)
    fake.enqueue(Reply(text=["x"] * 700, ending="stall", after_chunks=600))
    owner = await _peer(daemon)
    response = await owner.request("turn.start", {"prompt": "many"})
    turn_id = response["payload"]["turn_id"]
    deltas = 0
    while deltas < 600:
        frame = await owner.until(lambda f: f["t"] == "message")
        deltas += frame["message"].get("event") == "turn.assistant_delta"
    last = frame["message"]["payload"]["sequence"]
    follower = await _peer(daemon)
    answer, events = await follower.attach(turn_id, last - 512)
    assert answer["status"] == "attached" and answer["more"] is True
    # 512 events (the whole buffer), every one, in order.
    assert sequences(events) == list(range(last - 511, last + 1))
    cancel = await owner.request("turn.cancel", {"turn_id": turn_id})
    assert cancel["error"] is None
    live = await follower.turn_events(turn_id)
    assert live[-1]["event"] == "turn.terminal" and sequences(live)[0] > last
    await owner.close()
    await follower.close()


async def test_snapshot_pages_60_turns_of_16_kib_each_once_within_the_frame_bound(
    daemon: InMemoryDaemon, fake: FakeProviderServer
) -> None:
    answer = "é" * 8000  # 16,000 bytes of UTF-8
    peer = await _peer(daemon)
    started = []
    for _ in range(60):
        fake.enqueue(Reply(text=[answer]))
        response = await peer.request("turn.start", {"prompt": "long"})
        started.append(response["payload"]["turn_id"])
        await peer.turn_events(response["payload"]["turn_id"])
    seen: list[Frame] = []
    cursor = None
    pages = 0
    while True:
        frame: Frame = {"t": "snapshot"} if cursor is None else {"t": "snapshot", "cursor": cursor}
        page = await peer.call(frame, "snapshot_result")
        assert page["t"] == "snapshot_result"
        assert len(msgpack.packb(page)) < MAX_FRAME_BYTES
        seen += page["turns"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages > 1
    assert [item["turn_id"] for item in seen] == started
    for item in seen:
        assert item["assistant_text"] == answer and item["status"] == "completed"
        assert "assistant_text" not in item["terminal"]  # no text twice in an item
    only = await peer.call({"t": "snapshot", "turn_ids": started[:2]}, "snapshot_result")
    assert [item["turn_id"] for item in only["turns"]] == started[:2]
    bad = await peer.call({"t": "snapshot", "cursor": "forged"}, "snapshot_result")
    assert bad == {"t": "snapshot_error", "id": bad["id"], "code": "invalid_request"}
    await peer.close()


async def test_a_repeated_idempotency_key_starts_nothing_and_answers_the_first_acceptance(
    daemon: InMemoryDaemon, fake: FakeProviderServer
) -> None:
    fake.enqueue(Reply(text=["once"], chunk_delay=0.05))
    first = await _peer(daemon)
    await first.send_request("turn.start", {"prompt": "p"}, idempotency_key="k-1")
    await first.close()  # gone before reading the answer: the outcome is unknown to it
    retry = await _peer(daemon)
    rid = await retry.send_request("turn.start", {"prompt": "p"}, idempotency_key="k-1")
    response = await retry.until(
        lambda f: f["t"] == "message" and f["message"].get("request_id") == rid
    )
    payload = response["message"]["payload"]
    assert payload["status"] == "accepted"
    answer, events = await retry.attach(payload["turn_id"], -1)
    if answer["status"] != "finished":
        events += await retry.turn_events(payload["turn_id"])
    assert events[-1]["payload"]["assistant_text"] == "once"
    again = await retry.request("turn.start", {"prompt": "p"}, idempotency_key="k-1")
    assert again["payload"] == payload
    posts = [r for r in fake.requests if r.method == "POST"]
    assert len(posts) == 1
    # An invalid key is answered without running anything.
    message = envelope.request("rx", "status", {})
    await retry.channel.send({"t": "request", "message": message, "idempotency_key": "a b"})
    bad = await retry.until(lambda f: f["t"] == "request_error")
    assert bad["code"] == "invalid_idempotency_key" and bad["request_id"] == "rx"
    await retry.close()


async def test_a_refused_start_is_refused_again_under_its_key(daemon: InMemoryDaemon) -> None:
    peer = await _peer(daemon)
    missing = "s_" + "0" * 24
    first = await peer.request(
        "turn.start", {"prompt": "p"}, session_id=missing, idempotency_key="k"
    )
    again = await peer.request(
        "turn.start", {"prompt": "p"}, session_id=missing, idempotency_key="k"
    )
    assert first["error"] is not None
    assert again["error"]["code"] == first["error"]["code"]
    await peer.close()


async def test_an_outcome_is_answered_from_history_by_a_new_daemon(
    home: Path, project: Path, fake: FakeProviderServer
) -> None:
    write_settings(home, fake)
    fake.enqueue(Reply(text=["kept ", "answer"]))
    async with in_memory_daemon(home, project) as first:
        peer = await _peer(first)
        response = await peer.request("turn.start", {"prompt": "p"}, idempotency_key="key-9")
        turn_id, session_id = response["payload"]["turn_id"], response["payload"]["session_id"]
        terminal = (await peer.turn_events(turn_id))[-1]["payload"]
        await peer.close()
    async with in_memory_daemon(home, project) as second:
        peer = await _peer(second)
        unknown = await peer.call({"t": "attach", "turn_id": turn_id}, "attach_result")
        assert unknown["t"] == "attach_error" and unknown["code"] == "unknown_turn"
        answer, events = await peer.attach(turn_id, -1, session_id=session_id)
        assert answer["status"] == "finished"
        (event,) = events
        assert event["event"] == "turn.terminal"
        assert event["payload"] == terminal  # status, text and sequence as first sent
        # The key survived the restart with the turn's user record.
        again = await peer.request(
            "turn.start", {"prompt": "p"}, session_id=session_id, idempotency_key="key-9"
        )
        assert again["payload"] == {
            "turn_id": turn_id,
            "session_id": session_id,
            "status": "accepted",
        }
        await peer.close()
    assert len([r for r in fake.requests if r.method == "POST"]) == 1


async def test_a_turn_whose_daemon_died_is_answered_failed_once_reopened(
    daemon: InMemoryDaemon, home: Path
) -> None:
    store = SessionStore(home / "sessions")
    session_id = store.create()
    with store.acquire_writer_lease(session_id) as lease:  # the dead daemon's writes
        lease.append({"type": "user", "turn_id": "turn_dead", "text": "p"})
        lease.append({"type": "assistant", "turn_id": "turn_dead", "text": "half"})
    peer = await _peer(daemon)
    answer, events = await peer.attach("turn_dead", -1, session_id=session_id)
    assert answer["status"] == "finished"
    payload = events[0]["payload"]
    assert payload["status"] == "failed" and payload["assistant_text"] == "half"
    assert payload["sequence"] == RECOVERED_SEQUENCE
    outcome = store.turn_outcome(session_id, "turn_dead")
    assert outcome is not None and outcome.status == "failed"  # durable now
    await peer.close()


def _dead_turn(store: SessionStore, session_id: str, turn_id: str, text: str) -> None:
    """What a daemon killed mid-turn leaves: the user record, some text, no terminal."""
    with store.acquire_writer_lease(session_id) as lease:
        lease.append({"type": "user", "turn_id": turn_id, "text": "p"})
        lease.append({"type": "assistant", "turn_id": turn_id, "text": text, "continued": True})


def _terminals(store: SessionStore, session_id: str, turn_id: str) -> list[dict[str, object]]:
    lines = (store._root / session_id / "history.jsonl").read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines]
    return [r for r in records if r["type"] == "terminal" and r["turn_id"] == turn_id]


async def test_session_open_closes_the_turn_a_dead_daemon_left_and_attach_answers_it(
    daemon: InMemoryDaemon, home: Path
) -> None:
    store = SessionStore(home / "sessions")
    session_id = store.create()
    _dead_turn(store, session_id, "turn_dead", "half")
    peer = await _peer(daemon)
    opened = await peer.request("session.open", {}, session_id=session_id)
    assert opened["error"] is None
    # Recorded at open: the session this client now holds has no turn left open.
    (terminal,) = _terminals(store, session_id, "turn_dead")
    assert terminal["status"] == "failed" and terminal["assistant_text"] == "half"
    answer, events = await peer.attach("turn_dead", -1, session_id=session_id)
    assert answer["status"] == "finished" and answer["failure"] == "service_interrupted"
    payload = events[0]["payload"]
    assert payload["status"] == "failed" and payload["assistant_text"] == "half"
    assert payload["sequence"] == RECOVERED_SEQUENCE
    assert len(_terminals(store, session_id, "turn_dead")) == 1
    await peer.close()


async def test_attach_closes_an_older_dead_turn_under_the_attachment_this_daemon_holds(
    daemon: InMemoryDaemon, home: Path
) -> None:
    store = SessionStore(home / "sessions")
    session_id = store.create()
    _dead_turn(store, session_id, "turn_dead", "half")
    with store.acquire_writer_lease(session_id) as lease:  # a later turn ended normally
        lease.append({"type": "user", "turn_id": "turn_later", "text": "q"})
        lease.append(
            {
                "type": "terminal",
                "turn_id": "turn_later",
                "status": "completed",
                "assistant_text": "",
            }
        )
    holder, asker = await _peer(daemon), await _peer(daemon)
    assert (await holder.request("session.open", {}, session_id=session_id))["error"] is None
    assert _terminals(store, session_id, "turn_dead") == []  # not the latest turn
    answer, events = await asker.attach("turn_dead", -1, session_id=session_id)
    assert answer["status"] == "finished" and answer["failure"] == "service_interrupted"
    assert events[0]["payload"]["status"] == "failed"
    (terminal,) = _terminals(store, session_id, "turn_dead")
    assert terminal["assistant_text"] == "half"
    # The holder still holds its attachment.
    closed = await holder.request("session.close", {}, session_id=session_id)
    assert closed["payload"]["status"] == "closed"
    await holder.close()
    await asker.close()


async def test_a_lost_clients_session_is_granted_to_one_other_client(
    daemon: InMemoryDaemon, fake: FakeProviderServer
) -> None:
    fake.enqueue(Reply(text=["partial"], ending="stall", after_chunks=1))
    owner = await _peer(daemon)
    response = await owner.request("turn.start", {"prompt": "hang"})
    turn_id, session_id = response["payload"]["turn_id"], response["payload"]["session_id"]
    taker, other = await _peer(daemon), await _peer(daemon)
    busy = await taker.call({"t": "take_control", "session_id": session_id}, "control_granted")
    assert busy["t"] == "grant_error" and busy["code"] == "session_busy"  # its owner is here
    await owner.close()
    counts = daemon.server.core.counts
    for _ in range(200):
        if counts()["detached_turns"] == 1:
            break
        await asyncio.sleep(0.01)
    limits = counts()
    assert (limits["max_active_turns_per_client"], limits["max_active_turns"]) == (16, 64)
    granted = await taker.call({"t": "take_control", "session_id": session_id}, "control_granted")
    assert granted["t"] == "control_granted"
    assert [t["turn_id"] for t in granted["turns"]] == [turn_id]
    refused = await other.call({"t": "take_control", "session_id": session_id}, "control_granted")
    assert refused["t"] == "grant_error" and refused["code"] == "session_busy"
    not_theirs = await other.request("turn.cancel", {"turn_id": turn_id})
    assert not_theirs["error"]["code"] == "unknown_turn"
    cancel = await taker.request("turn.cancel", {"turn_id": turn_id})
    assert cancel["error"] is None
    _, events = await taker.attach(turn_id, granted["turns"][0]["sequence"])
    events += (
        []
        if events and events[-1]["event"] == "turn.terminal"
        else await taker.turn_events(turn_id)
    )
    assert events[-1]["payload"]["status"] == "cancelled"
    await taker.close()
    await other.close()


async def _follow_to_the_end(peer: Peer, turn_id: str) -> None:
    """Attach and read the turn to its terminal, attaching again whenever this reader is
    cut too (the limit applies to every connection; a loaded machine reads slowly)."""
    after = -1
    while True:
        _, events = await peer.attach(turn_id, after)
        if events and events[-1]["event"] == "turn.terminal":
            return
        frame = await peer.until(
            lambda f: (
                (f["t"] == "overloaded" and f["turn_id"] == turn_id)
                or (
                    f["t"] == "message"
                    and f["message"]["kind"] == "event"
                    and f["message"]["event"] == "turn.terminal"
                    and f["message"]["payload"]["turn_id"] == turn_id
                )
            )
        )
        if frame["t"] != "overloaded":
            return
        after = frame["after_sequence"]


async def test_a_client_that_stops_reading_is_cut_then_recovers_by_attach(
    daemon: InMemoryDaemon, fake: FakeProviderServer
) -> None:
    daemon.server.outbound_limit = 4096
    chunks = [f"{i:04d}" * 16 for i in range(200)]
    fake.enqueue(Reply(text=chunks, chunk_delay=0.001))
    slow = await _peer(daemon)
    response = await slow.request("turn.start", {"prompt": "flood"})
    turn_id = response["payload"]["turn_id"]
    watcher = await _peer(daemon)
    await _follow_to_the_end(watcher, turn_id)  # the turn ran on, unaffected
    notice = await slow.until(lambda f: f["t"] == "overloaded")
    assert notice["turn_id"] == turn_id
    after = notice["after_sequence"]
    before = [
        f["message"] for f in slow.seen if f["t"] == "message" and f["message"]["kind"] == "event"
    ]
    assert sequences(before) == list(range(after + 1))  # nothing after the cut
    answer, rest = await slow.attach(turn_id, after)
    assert answer["status"] == "finished"
    assert sequences(rest)[0] == after + 1
    text = "".join(e["payload"].get("text", "") for e in before + rest[:-1])
    assert text == rest[-1]["payload"]["assistant_text"] == "".join(chunks)
    await slow.close()
    await watcher.close()


async def test_a_burst_past_the_inbox_bound_pauses_reading_and_every_frame_is_answered(
    daemon: InMemoryDaemon,
) -> None:
    # Far more frames than the inbox holds (64), sent before reading any answer: reading
    # pauses, resumes as the role works the inbox down, and nothing is lost or reordered.
    peer = await _peer(daemon)
    ids = [f"b{i}" for i in range(300)]
    for rid in ids:
        message = envelope.request(rid, "status", {})
        await peer.channel.send({"t": "request", "message": message})
    answered = []
    while len(answered) < len(ids):
        frame = await peer.until(lambda f: f["t"] == "message")
        answered.append(frame["message"]["request_id"])
    assert answered == ids
    await peer.close()
