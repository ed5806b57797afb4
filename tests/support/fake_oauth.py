"""A loopback fake of the OpenAI OAuth issuer (stdlib only, 127.0.0.1, OS-chosen port).

In-process::

    with FakeOAuthIssuer() as issuer:
        env = {"MC_CODEX_AUTH_ISSUER": issuer.url}

As a subprocess: ``python -m tests.support.fake_oauth [--mode success|error|slow]`` prints
the port on its first stdout line and serves until stdin closes.

Routes:
- ``GET /oauth/authorize``: checks client_id and S256 challenge, remembers the challenge
  and redirect URI under a fresh code, and answers 302 to ``redirect_uri?code=…&state=…``
  (a test follows it with a real GET to play the browser).
- ``POST /oauth/token``: ``authorization_code`` (form; verifies the PKCE verifier, the
  redirect URI and single use) and ``refresh_token`` (JSON or form; rotates the refresh
  token). ``mode`` ``error`` answers 400 with an OAuth error body, ``slow`` sleeps
  ``slow_seconds`` first.

Tokens are unsigned JWTs (``alg: none``) carrying ``https://api.openai.com/auth`` claims
(``chatgpt_account_id``, ``chatgpt_plan_type``) and ``exp``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import itertools
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

CLIENT_ID = "app_EMoamEEZ73f0CkXaXp7hrann"
ERROR_DESCRIPTION = "fake-issuer-error-detail-SHOULD-NOT-LEAK"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unsigned_jwt(claims: dict[str, Any]) -> str:
    header = b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    return f"{header}.{b64url(json.dumps(claims).encode())}."


@dataclass
class RecordedRequest:
    method: str
    path: str
    params: dict[str, str]
    content_type: str


@dataclass
class _Grant:
    challenge: str
    redirect_uri: str
    used: bool = False


@dataclass
class FakeOAuthIssuer:
    mode: str = "success"  # success | error | slow
    slow_seconds: float = 5.0
    account_id: str = "acct-fake-0001"
    plan: str = "plus"
    access_ttl: int = 3600  # seconds; negative issues already-expired access tokens
    token_prefix: str = "fake"
    code_prefix: str = "code-fake"
    issue_refresh_token: bool = True
    requests: list[RecordedRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._grants: dict[str, _Grant] = {}
        self.live_refresh_tokens: set[str] = set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> FakeOAuthIssuer:
        issuer = self

        class Handler(_Handler):
            fake = issuer

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeOAuthIssuer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- tokens ----------------------------------------------------------------------
    def mint_tokens(self, account_id: str | None = None) -> dict[str, Any]:
        """A token response as the issuer sends it (also used to seed stores in tests)."""
        n = next(self._counter)
        account = account_id or self.account_id
        auth = {"chatgpt_account_id": account, "chatgpt_plan_type": self.plan}
        exp = int(time.time()) + self.access_ttl
        jti = f"{self.token_prefix}-access-{n}"
        access = unsigned_jwt({"exp": exp, "jti": jti, "https://api.openai.com/auth": auth})
        id_token = unsigned_jwt(
            {"exp": exp, "email": "user@example.invalid", "https://api.openai.com/auth": auth}
        )
        body: dict[str, Any] = {"access_token": access, "id_token": id_token, "expires_in": 3600}
        if self.issue_refresh_token:
            refresh = f"{self.token_prefix}-refresh-{n}"
            with self._lock:
                self.live_refresh_tokens.add(refresh)
            body["refresh_token"] = refresh
        return body

    def _authorize(self, params: dict[str, str]) -> tuple[int, dict[str, str]]:
        if params.get("client_id") != CLIENT_ID or params.get("code_challenge_method") != "S256":
            return 400, {}
        if not params.get("code_challenge") or not params.get("redirect_uri"):
            return 400, {}
        code = f"{self.code_prefix}-{next(self._counter)}"
        with self._lock:
            self._grants[code] = _Grant(params["code_challenge"], params["redirect_uri"])
        query = urlencode({"code": code, "state": params.get("state", "")})
        return 302, {"Location": f"{params['redirect_uri']}?{query}"}

    def _token(self, params: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if self.mode == "slow":
            time.sleep(self.slow_seconds)
        if self.mode == "error":
            return 400, {"error": "invalid_grant", "error_description": ERROR_DESCRIPTION}
        grant_type = params.get("grant_type")
        if params.get("client_id") != CLIENT_ID:
            return 401, {"error": "invalid_client"}
        if grant_type == "authorization_code":
            return self._code_grant(params)
        if grant_type == "refresh_token":
            with self._lock:
                known = params.get("refresh_token") in self.live_refresh_tokens
                self.live_refresh_tokens.discard(params.get("refresh_token", ""))
            if not known:
                return 401, {"error": {"code": "refresh_token_reused"}}
            body = self.mint_tokens()
            body.pop("id_token")  # refresh responses may omit it
            return 200, body
        return 400, {"error": "unsupported_grant_type"}

    def _code_grant(self, params: dict[str, str]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            grant = self._grants.get(params.get("code", ""))
            if grant is None or grant.used:
                return 400, {"error": "invalid_grant"}
            grant.used = True
        verifier = params.get("code_verifier", "")
        if b64url(hashlib.sha256(verifier.encode()).digest()) != grant.challenge:
            return 400, {"error": "invalid_grant", "error_description": "pkce"}
        if params.get("redirect_uri") != grant.redirect_uri:
            return 400, {"error": "invalid_grant", "error_description": "redirect_uri"}
        return 200, self.mint_tokens()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout tests) breaks the pipe; that is expected here.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOAuthIssuer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _record(self, params: dict[str, str]) -> None:
        content_type = self.headers.get("Content-Type", "")
        request = RecordedRequest(self.command, urlsplit(self.path).path, params, content_type)
        self.fake.requests.append(request)

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        params = {k: v[0] for k, v in parse_qs(url.query).items()}
        self._record(params)
        if url.path != "/oauth/authorize":
            self._send(404, b"", {})
            return
        status, headers = self.fake._authorize(params)
        self._send(status, b"", headers)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.headers.get("Content-Type", "").startswith("application/json"):
            loaded = json.loads(raw or b"{}")
            params = {k: str(v) for k, v in loaded.items()}
        else:
            params = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
        self._record(params)
        if urlsplit(self.path).path != "/oauth/token":
            self._send(404, b"", {})
            return
        status, body = self.fake._token(params)
        self._send(status, json.dumps(body).encode(), {"Content-Type": "application/json"})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=["success", "error", "slow"], default="success")
    parser.add_argument("--account-id", default="acct-fake-0001")
    parser.add_argument("--access-ttl", type=int, default=3600)
    args = parser.parse_args(argv)
    issuer = FakeOAuthIssuer(mode=args.mode, account_id=args.account_id, access_ttl=args.access_ttl)
    with issuer:
        print(issuer.port, flush=True)
        sys.stdin.read()  # serve until the parent closes our stdin


if __name__ == "__main__":
    main()
