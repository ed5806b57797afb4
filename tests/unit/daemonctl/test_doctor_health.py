"""``doctor``'s judgement of a daemon's reported health against its documented limits."""

from __future__ import annotations

from typing import Any

from magi_code.daemonctl.doctor import DAEMON_CHILD_LIMIT, DAEMON_RSS_LIMIT_BYTES, daemon_health


def _status(rss: int = 80 * 1024 * 1024, tools: int = 1, zombies: int = 0) -> dict[str, Any]:
    children = {"tool": tools, "hook": 0, "mcp_server": 0, "worker": 0, "other": 0}
    return {"rss_bytes": rss, "children": children, "zombies": zombies}


def test_a_daemon_within_its_limits_is_ok() -> None:
    finding = daemon_health(_status(rss=DAEMON_RSS_LIMIT_BYTES, tools=DAEMON_CHILD_LIMIT))
    assert finding.status == "ok"
    assert finding.detail == f"1024 MiB resident, {DAEMON_CHILD_LIMIT} child processes"


def test_memory_children_and_zombies_over_the_limits_are_flagged() -> None:
    memory = daemon_health(_status(rss=DAEMON_RSS_LIMIT_BYTES + 1))
    assert memory.status == "warn" and "over 1024 MiB" in memory.detail
    children = daemon_health(_status(tools=DAEMON_CHILD_LIMIT + 1))
    assert children.status == "warn" and f"over {DAEMON_CHILD_LIMIT} children" in children.detail
    zombie = daemon_health(_status(zombies=1))
    assert zombie.status == "warn" and "1 unreaped (zombie) children" in zombie.detail
    assert "magi-code daemon status" in zombie.remedy
