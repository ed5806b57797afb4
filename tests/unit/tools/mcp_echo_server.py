"""A small real MCP stdio server for the toolset tests (run as a script, not imported).

Tools: ``echo`` returns its text (and the env variable named by ``env_name``, if given),
``fail`` raises, ``slow`` sleeps, ``spawn`` starts a long-lived grandchild and returns its
pid, ``crash`` exits the server process.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("echo-test")


@server.tool(description="Echo the text back.")
def echo(text: str, env_name: str = "") -> str:
    if env_name:
        return f"{text}|{env_name}={os.environ.get(env_name, '<unset>')}"
    return text


@server.tool(description="Always fails.")
def fail() -> str:
    raise RuntimeError("deliberate failure")


@server.tool(description="Sleep for the given seconds, then answer.")
async def slow(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "done"


@server.tool(description="Start a grandchild sleep and return its pid.")
def spawn() -> str:
    child = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL)
    return str(child.pid)


@server.tool(description="Exit the server process at once.")
def crash() -> str:
    os._exit(3)


@server.tool(description="Report the working directory.")
def cwd() -> str:
    return os.getcwd()


if __name__ == "__main__":
    sys.exit(server.run("stdio"))
