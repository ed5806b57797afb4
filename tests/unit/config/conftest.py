"""Fixtures for the config domain: isolated launch contexts, settings/catalog writers and
a loopback model-listing server speaking the real provider wire formats."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from config_helpers import ModelServer

from magi_code.storage.launch import LaunchContext


@pytest.fixture
def make_ctx(home: Path, project: Path) -> Callable[..., LaunchContext]:
    def make(**env: str) -> LaunchContext:
        return LaunchContext(mc_home=home, project_dir=project, env=dict(env))

    return make


@pytest.fixture
def ctx(make_ctx: Callable[..., LaunchContext]) -> LaunchContext:
    return make_ctx()


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    state = ModelServer()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            state.requests.append((path, {k.lower(): v for k, v in self.headers.items()}))
            status, body = state.routes.get(path, (404, {"error": "not found"}))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.base = f"http://127.0.0.1:{server.server_address[1]}"
    # shutdown() waits for the loop's next poll: the default half second, at every test.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
