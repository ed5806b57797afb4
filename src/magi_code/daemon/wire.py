"""Protocol v2 vocabulary shared by the daemon and ``magi_code.client`` (RFC-0002).

Frames are msgpack maps (``protocol/frames.py``) with a string ``t``. This module only
names and validates; it does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from magi_code.storage.launch import LaunchContext

PROTOCOL_VERSION: Final = 2
SUPPORTED_VERSIONS: Final = (2,)
MAX_HELLO_VERSIONS: Final = 8
MAX_ENV_ENTRIES: Final = 4096
MAX_CLIENT_NAME: Final = 64
MAX_DELTA_INTERVAL_MS: Final = 10_000

Role = Literal["v1_shim", "persistent", "control"]
ROLES: Final[dict[str, str]] = {
    "v1_shim": "connection",
    "persistent": "persistent",
    "control": "control",
}

# Refusal and fatal error codes (fixed messages: never request data, paths or secrets).
REFUSALS: Final[dict[str, str]] = {
    "unsupported_version": "no common protocol version",
    "invalid_hello": "the hello frame is invalid",
    "wrong_home": "this daemon serves another MC_HOME",
    "draining": "the daemon is stopping; retry",
}
ERRORS: Final[dict[str, str]] = {
    "framing_error": "invalid frame",
    "unknown_frame": "unknown frame type",
    "protocol_error": "frame not valid in this state",
    "internal_error": "internal error",
}
# ``request_error`` codes: the request was answered without running (RFC-0002 §6.4).
REQUEST_ERRORS: Final[dict[str, str]] = {
    "deadline_exceeded": "the request deadline passed before it could run",
    "invalid_deadline": "the request deadline is invalid",
}


class WireError(Exception):
    """A frame violates RFC-0002; ``code`` is one of :data:`ERRORS` or :data:`REFUSALS`."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def hello(
    role: Role,
    ctx: LaunchContext | None,
    client_name: str,
    version: str,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "t": "hello",
        "protocol_versions": list(SUPPORTED_VERSIONS),
        "client_name": client_name[:MAX_CLIENT_NAME],
        "client_version": version,
        "role": role,
        "options": dict(options or {}),
    }
    if ctx is not None:
        frame["launch"] = {
            "mc_home": str(ctx.mc_home),
            "project_dir": str(ctx.project_dir),
            "env": dict(ctx.env),
        }
    return frame


@dataclass(frozen=True, slots=True)
class Hello:
    role: Role
    version: int
    launch: LaunchContext | None
    client_name: str
    delta_interval_ms: int = 0


def parse_hello(frame: dict[str, Any]) -> Hello:
    """Validate a client's first frame; raises :class:`WireError` with a refusal code."""
    if frame.get("t") != "hello":
        raise WireError("invalid_hello")
    versions = frame.get("protocol_versions")
    if (
        not isinstance(versions, list)
        or not 0 < len(versions) <= MAX_HELLO_VERSIONS
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in versions)
    ):
        raise WireError("invalid_hello")
    common = [v for v in versions if v in SUPPORTED_VERSIONS]
    if not common:
        raise WireError("unsupported_version")
    role = frame.get("role")
    if role not in ROLES:
        raise WireError("invalid_hello")
    name = frame.get("client_name", "")
    if not isinstance(name, str) or len(name) > MAX_CLIENT_NAME:
        raise WireError("invalid_hello")
    options = frame.get("options", {})
    if not isinstance(options, dict):
        raise WireError("invalid_hello")
    interval = options.get("delta_interval_ms", 0)
    if (
        not isinstance(interval, int)
        or isinstance(interval, bool)
        or not 0 <= interval <= MAX_DELTA_INTERVAL_MS
    ):
        raise WireError("invalid_hello")
    launch = None
    if role != "control":
        launch = _parse_launch(frame.get("launch"))
    return Hello(role, max(common), launch, name, interval)


def _parse_launch(value: object) -> LaunchContext:
    if not isinstance(value, dict):
        raise WireError("invalid_hello")
    home, project, env = value.get("mc_home"), value.get("project_dir"), value.get("env")
    if not isinstance(home, str) or not isinstance(project, str) or not isinstance(env, dict):
        raise WireError("invalid_hello")
    if not (home.startswith("/") and project.startswith("/")) or len(env) > MAX_ENV_ENTRIES:
        raise WireError("invalid_hello")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise WireError("invalid_hello")
    return LaunchContext(mc_home=Path(home), project_dir=Path(project), env=dict(env))


def refused(code: str) -> dict[str, Any]:
    return {"t": "refused", "code": code, "message": REFUSALS[code]}


def error(code: str) -> dict[str, Any]:
    return {"t": "error", "code": code, "message": ERRORS[code]}


def request_error(request_id: object, code: str) -> dict[str, Any]:
    rid = request_id if isinstance(request_id, str) else None
    return {"t": "request_error", "request_id": rid, "code": code, "message": REQUEST_ERRORS[code]}
