"""The launch context carries the frontend's umask (issue #13): captured at process start,
sent at hello, and the process's own mask only when a client did not send one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from magi_code.client.channel import launch_of
from magi_code.storage.launch import LaunchContext, current_umask


@pytest.fixture
def umask_027() -> Iterator[None]:
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("umask_027")
def test_current_umask_reads_the_mask_and_leaves_it_as_it_is() -> None:
    assert current_umask() == 0o027
    assert os.umask(0o027) == 0o027  # unchanged by the read
    os.umask(0o002)
    assert current_umask() == 0o002


@pytest.mark.usefixtures("umask_027")
def test_from_process_captures_the_mask_and_launch_of_sends_it() -> None:
    ctx = LaunchContext.from_process()
    assert ctx.umask == 0o027
    assert ctx.tool_umask == 0o027
    assert launch_of(ctx).umask == 0o027
    os.umask(0o077)  # the mask captured at start stays the context's
    assert ctx.tool_umask == 0o027


@pytest.mark.usefixtures("umask_027")
def test_without_a_client_mask_tools_use_the_process_mask(tmp_path: Path) -> None:
    ctx = LaunchContext(tmp_path, tmp_path, {})
    assert ctx.umask is None
    assert launch_of(ctx).umask is None
    assert ctx.tool_umask == 0o027
    os.umask(0o077)  # as in the daemon
    assert ctx.tool_umask == 0o077
    assert LaunchContext(tmp_path, tmp_path, {}, umask=0).tool_umask == 0
