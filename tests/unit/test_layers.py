"""The package layering holds: dependencies point one way, and there is no cycle.

Read from the source with ``ast`` (function-level imports included), so an import added
anywhere in a package counts.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import magi_code

ROOT = Path(magi_code.__file__).parent

# package -> packages it must never import (directly or in a function body).
FORBIDDEN: dict[str, set[str]] = {
    "protocol": {
        "core",
        "daemon",
        "client",
        "shim",
        "stdio",
        "daemonctl",
        "endpoint",
        "sessions",
        "turns",
        "auth",
        "config",
        "providers",
        "tools",
        "storage",
    },
    "endpoint": {"core", "daemon", "client", "shim", "stdio", "daemonctl"},
    "core": {"daemon", "client", "shim", "stdio", "daemonctl", "endpoint", "cli"},
    "client": {"core", "daemon", "shim", "stdio", "daemonctl", "sessions", "turns", "cli"},
    "daemon": {"client", "shim", "daemonctl", "cli", "stdio"},
    "shim": {"core", "daemon", "daemonctl", "cli"},
    "daemonctl": {"shim", "cli", "acp"},
    # The ACP adapter is a client of the core (client/, daemon/ for embedded mode).
    "acp": {"core", "shim", "daemonctl", "cli", "sessions", "turns", "tools"},
}
# Nothing below the entry point uses the ACP adapter.
for _package in ("protocol", "endpoint", "core", "client", "daemon", "shim"):
    FORBIDDEN[_package].add("acp")


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        package = path.relative_to(ROOT).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                parts = name.split(".")
                if parts[0] == "magi_code" and len(parts) > 1 and parts[1] != package:
                    graph[package].add(parts[1])
    return graph


def test_no_package_imports_a_layer_it_must_not() -> None:
    graph = _imports()
    wrong = {pkg: sorted(graph[pkg] & banned) for pkg, banned in FORBIDDEN.items()}
    assert {pkg: bad for pkg, bad in wrong.items() if bad} == {}


def test_the_adapter_packages_import_each_other_without_a_cycle() -> None:
    graph = _imports()
    nodes = {"client", "daemon", "core", "endpoint", "daemonctl", "shim", "protocol", "acp"}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node] & nodes):
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join([*trail, node, nxt])}"
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for node in sorted(nodes):
        if node not in state:
            visit(node, [])
