"""The tool-call boundary, output bounds and child environment (issue: built-in tools)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magi_code.tools.base import (
    MAX_OUTPUT_BYTES,
    TRUNCATION_MARKER,
    ToolContext,
    ToolInputError,
    ToolOutcome,
    parse_arguments,
    run_named_tool,
    run_tool,
)
from magi_code.tools.builtin import BUILTIN_TOOL_NAMES, BUILTIN_TOOLS
from magi_code.tools.environment import child_environment


class _Recorder:
    name = "recorder"
    description = "records its arguments"
    parameters: Mapping[str, object] = {"type": "object"}

    def __init__(self, behaviour: str = "ok") -> None:
        self.behaviour = behaviour
        self.seen: list[Mapping[str, object]] = []

    async def run(self, arguments: Mapping[str, object], ctx: ToolContext) -> ToolOutcome:
        self.seen.append(arguments)
        if self.behaviour == "bug":
            raise KeyError("/secret/path/in/exception")
        if self.behaviour == "input":
            raise ToolInputError("bad input for the model")
        if self.behaviour == "cancel":
            raise asyncio.CancelledError
        return ToolOutcome("fine")


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(project_dir=tmp_path, env={})


async def test_run_tool_parses_json_object_arguments(ctx: ToolContext) -> None:
    tool = _Recorder()
    outcome = await run_tool(tool, '{"a": 1, "b": "x"}', ctx)
    assert outcome == ToolOutcome("fine")
    assert tool.seen == [{"a": 1, "b": "x"}]


async def test_run_tool_treats_empty_argument_text_as_no_arguments(ctx: ToolContext) -> None:
    tool = _Recorder()
    assert not (await run_tool(tool, "  ", ctx)).is_error
    assert tool.seen == [{}]


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"text"', "null", "[" * 100_000])
async def test_run_tool_reports_bad_argument_json_to_the_model(ctx: ToolContext, raw: str) -> None:
    tool = _Recorder()
    outcome = await run_tool(tool, raw, ctx)
    assert outcome.is_error
    assert "JSON" in outcome.output
    assert tool.seen == []


def typed(value: object) -> object:
    """``value`` with every number tagged by its type, NaN made comparable."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    return (type(value).__name__, value)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: past 64 bits too
    | st.floats()  # NaN and the infinities: json writes and reads them
    | st.text(),  # lone surrogates too
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300)
@given(arguments=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5))
def test_argument_text_reads_as_json_reads_it(arguments: dict[str, object]) -> None:
    for raw in (json.dumps(arguments), json.dumps(arguments, ensure_ascii=False)):
        assert typed(parse_arguments(raw)) == typed(json.loads(raw))


@pytest.mark.parametrize(
    "raw",
    [
        '{"n": 18446744073709551616}',
        '{"n": -9223372036854775809}',
        '{"n": 1111111111111111111}',
        '{"n": 0.1e999, "m": -Infinity}',
        '{"s": "\\ud800"}',
        '{"s": "\ud800"}',  # the character itself, not its escape
        '{"a": 1, "a": 2}',
    ],
)
def test_argument_text_json_reads_differently_from_orjson(raw: str) -> None:
    assert typed(parse_arguments(raw)) == typed(json.loads(raw))


async def test_unexpected_tool_exception_becomes_error_without_its_text(ctx: ToolContext) -> None:
    outcome = await run_tool(_Recorder("bug"), "{}", ctx)
    assert outcome.is_error
    assert "KeyError" in outcome.output
    assert "/secret/path" not in outcome.output


async def test_tool_input_error_message_reaches_the_model(ctx: ToolContext) -> None:
    outcome = await run_tool(_Recorder("input"), "{}", ctx)
    assert outcome == ToolOutcome("bad input for the model", is_error=True)


async def test_cancellation_propagates_through_run_tool(ctx: ToolContext) -> None:
    with pytest.raises(asyncio.CancelledError):
        await run_tool(_Recorder("cancel"), "{}", ctx)


async def test_run_named_tool_reports_unknown_names(ctx: ToolContext) -> None:
    tool = _Recorder()
    assert not (await run_named_tool({"recorder": tool}, "recorder", "{}", ctx)).is_error
    unknown = await run_named_tool({"recorder": tool}, "nope", "{}", ctx)
    assert unknown.is_error
    assert len(tool.seen) == 1


def test_outcome_output_is_bounded_with_a_marker() -> None:
    outcome = ToolOutcome("é" * MAX_OUTPUT_BYTES)
    assert len(outcome.output.encode()) <= MAX_OUTPUT_BYTES
    assert outcome.output.endswith(TRUNCATION_MARKER)
    assert outcome.output.startswith("é" * 100)
    small = ToolOutcome("short")
    assert small.output == "short"


def test_builtin_tools_have_unique_names_and_object_schemas() -> None:
    assert {
        "read_file",
        "write_file",
        "edit_file",
        "list_files",
        "grep",
        "shell",
    } == BUILTIN_TOOL_NAMES
    assert len(BUILTIN_TOOLS) == len(BUILTIN_TOOL_NAMES)
    for tool in BUILTIN_TOOLS:
        assert tool.parameters["type"] == "object"
        assert tool.description


def test_child_environment_strips_service_and_credential_variables() -> None:
    env = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "XDG_RUNTIME_DIR": "/run/user/1",
        "MC_HOME": "/tmp/mc",
        "MC_DAEMON_SOCKET": "/tmp/mc.sock",
        "MC_RUNTIME_DIR": "/tmp/run",
        "MC_DAEMON_ANYTHING": "x",
        "MC_SERVICE_MODE": "embedded",
        "MC_CODEX_BASE_URL": "http://127.0.0.1:1",
        "ANTHROPIC_API_KEY": "sk-ant",
        "ANTHROPIC_AUTH_TOKEN": "tok",
        "OPENAI_API_KEY": "sk-oai",
        "MY_PROVIDER_KEY": "custom",
        "MC_MODEL": "m",
    }
    child = child_environment(env, secret_names=["MY_PROVIDER_KEY"])
    assert child == {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "XDG_RUNTIME_DIR": "/run/user/1",
        "MC_MODEL": "m",
    }
    assert "MC_HOME" in env  # the input mapping is not modified
