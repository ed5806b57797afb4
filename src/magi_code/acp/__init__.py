"""``magi-code --app acp``: the Agent Client Protocol (ACP v1) over stdio; see ``docs/acp.md``.

An adapter over the same core as every other frontend: it is a persistent (v2) client of
the per-user daemon (``magi_code.client``; in embedded mode of a daemon server running in
this process, reached through the in-memory transport), and translates ACP's JSON-RPC
methods into v1 requests and the v1 turn events into ACP ``session/update`` notifications.
It orchestrates no turn itself.

- ``rpc``: JSON-RPC 2.0 over stdio, one message per line, bounded.
- ``backend``: one core connection per project directory, in either mode.
- ``updates``: v1 events and replay items as ACP session updates (pure functions).
- ``agent``: the ACP methods.
"""
