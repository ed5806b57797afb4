"""Start-up imports only what it needs: each check runs in a fresh interpreter.

``import magi_code.cli`` (every command's first step) loads no heavy third-party module, and
the daemon's operator commands but ``run`` load neither the daemon nor the HTTP stack;
``magi_code.tools.mcp`` and a toolset without servers load nothing of the MCP SDK; the
daemon's preload imports every product module it can run (none of the frontends') but not
the SDK, nor the HTTP stack every turn uses, which ``warm_turn_modules`` loads (the daemon
calls it once it is ready).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import magi_code
from tests.support.product_source import parsed_modules

# Top-level packages that must not be loaded by importing the CLI module.
HEAVY_FOR_CLI = (
    "httpx",
    "httpcore",
    "h11",
    "mcp",
    "mcp_types",
    "anyio",
    "pydantic",
    "pydantic_core",
    "starlette",
    "uvicorn",
    "cryptography",
    "filelock",
    "uvloop",
    "orjson",
    "msgpack",
    "psutil",
    "importlib.metadata",
)
# httpx's command-line client and what it imports when installed (magi_code/__init__.py).
HTTPX_CLI = ("httpx._main", "click", "pygments")
# What the MCP SDK brings (none of it is needed by a turn without MCP servers).
MCP_SDK = ("mcp", "mcp_types", "pydantic", "pydantic_core", "starlette", "uvicorn", "cryptography")


def loaded_after(code: str, cwd: Path) -> set[str]:
    """The modules loaded (``sys.modules`` entries that are not ``None``, the mark of a
    module that must not be imported) after running ``code`` in a new interpreter."""
    script = (
        f"{code}\nimport json, sys\n"
        "print(json.dumps(sorted(n for n, m in sys.modules.items() if m is not None)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=cwd,
    )
    return set(json.loads(result.stdout.splitlines()[-1]))


def present(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """``names`` (top-level packages or exact module names) found among ``modules``."""
    return sorted(
        name for name in names if name in modules or any(m.startswith(f"{name}.") for m in modules)
    )


def test_importing_the_cli_loads_no_heavy_module(tmp_path: Path) -> None:
    modules = loaded_after("import magi_code.cli", tmp_path)
    assert "magi_code.cli" in modules
    assert present(modules, HEAVY_FOR_CLI) == []
    assert present(modules, ("asyncio", "magi_code.composition", "magi_code.core")) == []


def test_the_daemon_commands_but_run_load_neither_the_daemon_nor_the_http_stack(
    tmp_path: Path,
) -> None:
    # ``daemon status``/``stop``/``start``/``install`` are a control client at most.
    code = "import magi_code.daemonctl.commands, magi_code.client.starter, magi_code.client"
    modules = loaded_after(code, tmp_path)
    assert "magi_code.daemonctl.units" in modules
    assert present(modules, ("magi_code.daemon.lifecycle", "magi_code.core", "httpx")) == []


def test_the_mcp_module_and_a_toolset_without_servers_load_no_sdk(tmp_path: Path) -> None:
    code = (
        "import asyncio\n"
        "from pathlib import Path\n"
        "from magi_code.tools.base import ToolContext\n"
        "from magi_code.tools.mcp import McpToolset, mcp_tool_name\n"
        "async def main():\n"
        f"    ctx = ToolContext(project_dir=Path({str(tmp_path)!r}), env={{}})\n"
        "    async with McpToolset([], ctx) as toolset:\n"
        "        assert toolset.tools() == [] and toolset.failed_servers == ()\n"
        "asyncio.run(main())\n"
        "assert mcp_tool_name('s', 't') == 'mcp__s__t'\n"
    )
    modules = loaded_after(code, tmp_path)
    assert "magi_code.tools.mcp" in modules
    assert present(modules, (*MCP_SDK, "anyio")) == []


def test_a_toolset_with_a_server_loads_the_sdk(tmp_path: Path) -> None:
    # The other side of the check above: the SDK does load where it is needed.
    code = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from magi_code.tools.base import ToolContext\n"
        "from magi_code.tools.mcp import McpServerSpec, McpToolset\n"
        "async def main():\n"
        f"    ctx = ToolContext(project_dir=Path({str(tmp_path)!r}), env={{}})\n"
        "    server = McpServerSpec('gone', '/nonexistent/mcp-server')\n"
        "    async with McpToolset([server], ctx, startup_timeout=5) as toolset:\n"
        "        assert toolset.failed_servers == ('gone',)\n"
        "asyncio.run(main())\n"
    )
    assert present(loaded_after(code, tmp_path), ("mcp",)) == ["mcp"]


WARMED = ("httpx", "http.cookiejar", "httpcore", "h11", "anyio._backends._asyncio", "certifi")


def test_the_daemon_preload_loads_the_product_but_no_sdk_and_warming_the_http_stack(
    tmp_path: Path,
) -> None:
    code = (
        "import sys\n"
        "from magi_code.daemon.preload import import_product_modules\n"
        "names = import_product_modules()\n"
        "assert 'magi_code.tools.mcp' in names and 'magi_code.composition' in names\n"
        f"assert [m for m in {WARMED!r} if m in sys.modules] == [], 'warmed at once'\n"
        # The frontends' side, which the daemon never runs, is left out.
        "frontends = [m for m in sys.modules if m.split('.')[:2] in (\n"
        "    ['magi_code', 'acp'], ['magi_code', 'cli'], ['magi_code', 'client'])]\n"
        "assert frontends == [], frontends\n"
        "from magi_code.turns.runtime import warm_turn_modules\n"
        "warm_turn_modules()\n"
    )
    modules = loaded_after(code, tmp_path)
    assert "magi_code.tools.mcp" in modules and "magi_code.turns.runtime" in modules
    assert present(modules, MCP_SDK) == []
    for warmed in WARMED:
        assert warmed in modules, warmed
    assert present(modules, HTTPX_CLI) == []


def test_the_services_are_built_without_the_http_stack_or_the_mcp_sdk(tmp_path: Path) -> None:
    code = (
        "from pathlib import Path\n"
        "from magi_code import composition\n"
        "from magi_code.storage.launch import LaunchContext\n"
        f"composition._domain_services(LaunchContext(Path({str(tmp_path)!r}), Path('.'), {{}}))\n"
    )
    modules = loaded_after(code, tmp_path)
    assert "magi_code.core.turns" in modules
    # httpx loads where a request is made, or when the daemon warms up once it answers.
    assert present(modules, ("httpx", *MCP_SDK)) == []


def test_no_product_module_uses_the_httpx_command_line() -> None:
    # magi_code/__init__.py keeps ``httpx._main`` from being imported: httpx then falls
    # back to a stub ``main``, which nothing may call.
    root = Path(magi_code.__file__).parent
    uses = []
    for path, tree in parsed_modules():
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                names = [f"{node.value.id}.{node.attr}"]
            wrong = [n for n in names if n in ("httpx.main", "httpx._main")]
            wrong += [n for n in names if n.split(".")[0] in ("click", "pygments")]
            uses += [f"{path.relative_to(root)}: {n}" for n in wrong]
    assert uses == []


def test_importing_the_product_then_httpx_loads_no_httpx_command_line(tmp_path: Path) -> None:
    code = "import magi_code, httpx\nassert httpx.main.__module__ == 'httpx'\n"
    modules = loaded_after(code, tmp_path)
    assert "httpx" in modules
    assert present(modules, HTTPX_CLI) == []
