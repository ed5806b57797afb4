"""Where ``daemon run`` logs: the journal alone under systemd, else ``daemon.log``.

systemd connects a unit's stderr to the journal and names that stream in
``JOURNAL_STREAM=<device>:<inode>``; here a plain file stands in for the journal stream.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.process.daemon.support import (
    cli,
    end_foreground,
    paths,
    start_foreground,
    status,
    wait_for,
)


def _stream_id(path: Path) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


@pytest.fixture
def run_daemon(home: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    end_foreground(home, procs)


def _start(
    home: Path, stderr_path: Path, journal: str, procs: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    proc = start_foreground(home, {"JOURNAL_STREAM": journal}, stderr_path)
    procs.append(proc)
    return proc


async def _serve_once_and_stop(home: Path, proc: subprocess.Popen[bytes]) -> dict[str, object]:
    answered: list[dict[str, object]] = []

    def answers() -> bool:
        assert proc.poll() is None, "the daemon exited"
        answered[:] = [status(home)]
        return "clients" in answered[0]  # an answer of the daemon, not the lock's word

    await wait_for(answers, timeout=60, what="the daemon to answer")
    info = answered[0]
    text = cli(home, "daemon", "status")
    assert text.returncode == 0, text.stderr
    info["text"] = text.stdout
    assert cli(home, "daemon", "stop").returncode == 0
    assert await asyncio.to_thread(proc.wait, 60) == 0
    return info


async def test_under_the_journal_each_line_goes_to_stderr_once_and_no_daemon_log(
    home: Path, tmp_path: Path, run_daemon: list[subprocess.Popen[bytes]]
) -> None:
    journal = tmp_path / "journal-stream"
    journal.touch()
    proc = _start(home, journal, _stream_id(journal), run_daemon)
    info = await _serve_once_and_stop(home, proc)
    assert info["log"] == "journal"
    assert "log:     journal (journalctl --user -u magi-code.service)" in str(info["text"])
    lines = journal.read_text().splitlines()
    assert [line for line in lines if "listening instance=" in line] == [
        next(line for line in lines if "listening instance=" in line)
    ]
    assert sum("stopping reason=control" in line for line in lines) == 1
    # journald reads the priority prefix and stamps the time itself.
    assert lines and all(re.match(r"<[0-7]>magi_code\.", line) for line in lines), lines
    assert not any(re.search(r"\d\d:\d\d:\d\d", line) for line in lines)
    assert not paths(home).log.exists()


async def test_stderr_that_is_not_the_journal_stream_keeps_daemon_log(
    home: Path, tmp_path: Path, run_daemon: list[subprocess.Popen[bytes]]
) -> None:
    """A JOURNAL_STREAM naming another file (inherited, stale): logging stays as it is."""
    other = tmp_path / "some-other-stream"
    other.touch()
    stderr = tmp_path / "stderr"
    proc = _start(home, stderr, _stream_id(other), run_daemon)
    info = await _serve_once_and_stop(home, proc)
    log = paths(home).log
    assert info["log"] == str(log)
    assert f"log:     {log}" in str(info["text"])
    assert log.read_text().count("listening instance=") == 1
    # The foreground's terminal line is unchanged (no priority prefix).
    assert stderr.read_text().count("magi-code: listening instance=") == 1
    assert "<6>" not in stderr.read_text()


def test_status_json_of_a_stopped_daemon_still_names_the_log_file(home: Path) -> None:
    result = cli(home, "daemon", "status", "--json")
    assert orjson.loads(result.stdout)["log"] == str(paths(home).log)
