from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

import magi_code
from magi_code.auth.store import AuthChanged, AuthStore
from magi_code.protocol.errors import ErrorCode, ServiceError

SECRET = "sk-ant-PLANTED-STORE-5e1d"


def _write(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.write_bytes(data)
    os.chmod(path, mode)


def _doc(entry: object) -> bytes:
    return json.dumps({"version": 1, "providers": {"a": entry}}).encode()


def _assert_sanitized(exc: ServiceError, path: Path) -> None:
    assert exc.code is ErrorCode.INTERNAL_ERROR
    rendered = "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)
    assert str(path) not in rendered
    assert path.name not in rendered
    assert SECRET not in rendered
    assert exc.__cause__ is None


def test_missing_store_reads_as_empty(store: AuthStore, home: Path) -> None:
    snapshot = store.read()
    assert snapshot.record("anthropic") is None
    assert snapshot.generation("anthropic") == 0
    assert not (home / "auth.json").exists()


def test_commit_writes_private_file_with_documented_format(store: AuthStore, home: Path) -> None:
    generation = store.commit("anthropic", {"type": "api_key", "key": SECRET}, None)
    path = home / "auth.json"
    assert generation == 1
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_bytes()) == {
        "version": 1,
        "providers": {"anthropic": {"generation": 1, "record": {"type": "api_key", "key": SECRET}}},
    }
    assert store.read().record("anthropic") == {"type": "api_key", "key": SECRET}


def test_commit_preserves_unrelated_records_and_unknown_fields(
    store: AuthStore, home: Path
) -> None:
    doc = {
        "version": 1,
        "future": {"kept": True},
        "providers": {"other": {"generation": 7, "record": {"type": "api_key", "key": "k"}}},
    }
    _write(home / "auth.json", json.dumps(doc).encode())
    store.commit("anthropic", {"type": "api_key", "key": SECRET}, None)
    store.remove("openai-codex")
    saved = json.loads((home / "auth.json").read_bytes())
    assert saved["future"] == {"kept": True}
    assert saved["providers"]["other"] == doc["providers"]["other"]
    assert saved["providers"]["anthropic"]["generation"] == 1
    assert saved["providers"]["openai-codex"] == {"generation": 1, "record": None}


def test_every_write_advances_the_generation_including_absent_logout(store: AuthStore) -> None:
    assert store.remove("anthropic") is False
    assert store.read().generation("anthropic") == 1
    assert store.commit("anthropic", {"type": "api_key", "key": "a"}, 1) == 2
    assert store.commit("anthropic", {"type": "api_key", "key": "b"}, None) == 3
    assert store.remove("anthropic") is True
    assert store.read().generation("anthropic") == 4
    assert store.read().record("anthropic") is None
    assert store.remove("anthropic") is False
    assert store.read().generation("anthropic") == 5


def test_commit_against_a_moved_generation_raises_auth_changed(store: AuthStore) -> None:
    observed = store.read().generation("openai-codex")
    store.remove("openai-codex")  # e.g. a concurrent logout
    with pytest.raises(AuthChanged) as info:
        store.commit("openai-codex", {"type": "oauth", "access_token": "x"}, observed)
    assert not isinstance(info.value, ServiceError)
    assert store.read().record("openai-codex") is None
    assert store.read().generation("openai-codex") == 1


def test_symlinked_store_is_refused_on_read_and_write(store: AuthStore, home: Path) -> None:
    target = home / "elsewhere.json"
    doc = {"version": 1, "providers": {"anthropic": {"generation": 1, "record": None}}}
    _write(target, json.dumps(doc).encode())
    (home / "auth.json").symlink_to(target)
    with pytest.raises(ServiceError) as info:
        store.read()
    _assert_sanitized(info.value, home / "auth.json")
    with pytest.raises(ServiceError) as info:
        store.commit("anthropic", {"type": "api_key", "key": SECRET}, None)
    _assert_sanitized(info.value, home / "auth.json")
    assert json.loads(target.read_bytes()) == doc


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o666])
def test_loose_permissions_are_refused(store: AuthStore, home: Path, mode: int) -> None:
    doc = {"version": 1, "providers": {"anthropic": {"generation": 1, "record": None}}}
    _write(home / "auth.json", json.dumps(doc).encode(), mode)
    with pytest.raises(ServiceError) as info:
        store.read()
    _assert_sanitized(info.value, home / "auth.json")


@pytest.mark.parametrize(
    "content",
    [
        f"not json {SECRET}".encode(),
        b"\xff\xfe\x00garbage",
        b"[]",
        json.dumps({"version": 2, "providers": {}}).encode(),
        json.dumps({"version": 1, "providers": []}).encode(),
        json.dumps({"version": 1, "providers": {"a": []}}).encode(),
        _doc({"generation": "1"}),
        _doc({"generation": True}),
        _doc({"generation": -1}),
        _doc({"generation": 1, "record": SECRET}),
        _doc({"generation": 1, "record": {"k": 1}}),
    ],
)
def test_garbage_or_wrong_shape_is_internal_error_without_content(
    store: AuthStore, home: Path, content: bytes
) -> None:
    _write(home / "auth.json", content)
    with pytest.raises(ServiceError) as info:
        store.read()
    _assert_sanitized(info.value, home / "auth.json")
    with pytest.raises(ServiceError) as info:
        store.commit("anthropic", None, None)
    _assert_sanitized(info.value, home / "auth.json")
    assert (home / "auth.json").read_bytes() == content  # never overwritten


def test_a_directory_in_place_of_the_store_is_internal_error(store: AuthStore, home: Path) -> None:
    (home / "auth.json").mkdir()
    with pytest.raises(ServiceError) as info:
        store.read()
    _assert_sanitized(info.value, home / "auth.json")


_WORKER = """
import sys
from pathlib import Path
from magi_code.auth.store import AuthStore
store = AuthStore(Path(sys.argv[1]))
provider, rounds = sys.argv[2], int(sys.argv[3])
for i in range(rounds):
    store.commit(provider, {"type": "api_key", "key": f"{provider}-{i}"}, None)
"""


def test_two_processes_committing_different_providers_lose_nothing(
    store: AuthStore, home: Path
) -> None:
    rounds = 40
    env = dict(os.environ, PYTHONPATH=str(Path(magi_code.__file__).parents[1]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(home / "auth.json"), provider, str(rounds)],
            env=env,
        )
        for provider in ("alpha", "beta")
    ]
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    snapshot = store.read()
    for provider in ("alpha", "beta"):
        assert snapshot.generation(provider) == rounds
        assert snapshot.record(provider) == {"type": "api_key", "key": f"{provider}-{rounds - 1}"}
    assert stat.S_IMODE((home / "auth.json").stat().st_mode) == 0o600
