"""Many ``magi-code daemon start`` processes at once make exactly one daemon."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.process.daemon.support import cli, status
from tests.stress.support import TIMEOUT, daemon_log, daemons_of, report, scaled
from tests.support.service import service_env

pytestmark = pytest.mark.timeout(TIMEOUT)


def test_concurrent_starters_make_exactly_one_daemon(home: Path) -> None:
    starters = scaled(10, 50)
    rounds = scaled(1, 3)
    pids_per_round = []
    for round_no in range(rounds):
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "magi_code", "daemon", "start"],
                env=service_env(home),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(starters)
        ]
        outputs = [proc.communicate(timeout=120) for proc in procs]
        codes = [proc.returncode for proc in procs]
        assert codes == [0] * starters, [err for _, err in outputs]
        pids = {int(m.group(1)) for out, _ in outputs if (m := re.search(r"pid (\d+)", out))}
        assert len(pids) == 1, outputs
        info = status(home)
        assert info["running"] is True and {info["pid"]} == pids
        assert daemons_of(home) == [info["pid"]]
        assert daemon_log(home).count("listening instance=") == round_no + 1
        pids_per_round.append(info["pid"])
        if round_no < rounds - 1:
            stopped = cli(home, "daemon", "stop")
            assert stopped.returncode == 0, stopped.stderr
            assert daemons_of(home) == []
    assert "Traceback" not in daemon_log(home)
    report(
        "starters",
        rounds=rounds,
        starters_per_round=starters,
        exit_zero=rounds * starters,
        daemons_per_round=1,
        pids=",".join(map(str, pids_per_round)),
    )
