"""Runtime tools: built-in file/search/shell tools and MCP servers as tools.

Import the submodules directly (``tools.base``, ``tools.builtin``, ``tools.mcp``) so the
MCP SDK is only loaded where MCP servers are used. See ``docs/tools.md``.
"""
