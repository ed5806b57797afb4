"""The hello ``launch.umask`` field: the frontend's file-mode creation mask (RFC-0002 §3).

Optional; an integer 0..0o777 for the ``v1_shim`` and ``persistent`` roles, where anything
else refuses the hello as ``invalid_hello``. A control hello reads only ``mc_home``.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

from magi_code.protocol.v2 import (
    Code,
    Eof,
    Fatal,
    Launch,
    Oversize,
    Record,
    Snapshot,
    hello,
    parse_hello,
)

LAUNCH = Launch("/home/user/.magi-code", "/work/project", {"LANG": "C"})


def frame(role: str, **launch_extra: Any) -> dict[str, Any]:
    built = hello(role, LAUNCH, "test", "0")  # type: ignore[arg-type]
    built["launch"].update(launch_extra)
    return built


@pytest.mark.parametrize("role", ["v1_shim", "persistent"])
@pytest.mark.parametrize("umask", [0, 0o022, 0o027, 0o077, 0o777])
def test_a_valid_umask_reaches_the_launch(role: str, umask: int) -> None:
    parsed = parse_hello(frame(role, umask=umask))
    assert parsed.launch == Launch(LAUNCH.mc_home, LAUNCH.project_dir, LAUNCH.env, umask)


@pytest.mark.parametrize("role", ["v1_shim", "persistent"])
def test_a_client_that_sends_no_umask_is_served_with_none(role: str) -> None:
    for built in (frame(role), frame(role, umask=None)):
        parsed = parse_hello(built)
        assert parsed.launch is not None
        assert parsed.launch.umask is None


@pytest.mark.parametrize("role", ["v1_shim", "persistent"])
@pytest.mark.parametrize("umask", [-1, 0o1000, 2**63, "18", "0o22", True, False, 18.0, [18]])
def test_an_invalid_umask_refuses_the_hello(role: str, umask: object) -> None:
    with pytest.raises(Fatal) as caught:
        parse_hello(frame(role, umask=umask))
    assert caught.value.code is Code.INVALID_HELLO


def test_the_builder_sends_the_umask_only_when_known() -> None:
    with_mask = hello("persistent", Launch("/h", "/p", {}, 0o027), "test", "0")
    assert with_mask["launch"]["umask"] == 0o027
    without = hello("persistent", Launch("/h", "/p", {}), "test", "0")
    assert "umask" not in without["launch"]
    # A control hello names its home only.
    control = hello("control", Launch("/h", "/p", {}, 0o027), "test", "0")
    assert control["launch"] == {"mc_home": "/h"}


def test_a_control_hello_does_not_read_the_umask() -> None:
    built = hello("control", LAUNCH, "test", "0")
    built["launch"]["umask"] = "not read"
    parsed = parse_hello(built)
    assert parsed.launch == Launch(LAUNCH.mc_home, "", {})


def test_frames_are_values_equal_by_class_and_fields_and_frozen() -> None:
    assert Record(b"x") == Record(b"x") and hash(Record(b"x")) == hash(Record(b"x"))
    assert Record(b"x") != Record(b"y") and Eof() != Oversize() and Eof() == Eof()
    assert Snapshot(1, turn_ids=frozenset({"t"})) == Snapshot(1, None, frozenset({"t"}))
    assert repr(LAUNCH) == (
        "Launch(mc_home='/home/user/.magi-code', project_dir='/work/project', "
        "env={'LANG': 'C'}, umask=None)"
    )
    with pytest.raises(AttributeError):
        LAUNCH.umask = 0


def test_frames_survive_copy_and_pickle() -> None:
    for frame in (LAUNCH, Snapshot(1, turn_ids=frozenset({"t"})), Record(b"x"), Eof()):
        assert copy.copy(frame) == frame
        assert copy.deepcopy(frame) == frame
        assert pickle.loads(pickle.dumps(frame)) == frame
