"""An agent whose tool list follows the MCP servers' ``notifications/tools/list_changed``.

Before each provider request the agent asks its tool source to re-list the servers that
announced a change; when the tools changed, that request (and the tool calls it leads
to) uses the new list. A turn without MCP servers asks a source that answers at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from magi_code.providers.types import ConversationItem, ToolSpec
from magi_code.tools.base import Tool

from .agent import Agent, AgentEnv


class RefreshableTools(Protocol):
    async def refresh(self) -> bool:
        """Re-list what changed; True when the tools are no longer those last built."""


class RefreshingAgent(Agent):
    """``Agent`` with ``tools()`` rebuilt whenever ``source.refresh()`` reports a change.

    ``tools`` builds the turn's whole list (built-ins, wrappers, the source's current
    MCP tools) and is called once now and again after each change.
    """

    def __init__(
        self,
        env: AgentEnv,
        tools: Callable[[], Sequence[Tool]],
        source: RefreshableTools,
        **options: Any,
    ) -> None:
        super().__init__(env, tools(), **options)
        self._build_tools = tools
        self._source = source

    # The parent's reply type is its own business: this only runs before it.
    async def _request(self, items: list[ConversationItem]) -> Any:
        if await self._source.refresh():
            current = self._build_tools()
            self.tools = {tool.name: tool for tool in current}
            self.specs = [ToolSpec(t.name, t.description, t.parameters) for t in current]
        return await super()._request(items)
