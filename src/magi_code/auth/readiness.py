"""``auth.status`` entries and the ``status.provider_auth_ready`` check.

Pure functions over an ``AuthSnapshot`` and the launch environment: no refresh, no
network, no writes. Mapping (documented in ``docs/authentication.md``):

- ``openai-codex``: ``oauth``/``shared_store``; ``ready`` with a refresh token or an
  unexpired access token, ``needs_login`` for a record that has neither, else ``missing``.
- ``anthropic``: a nonblank ``ANTHROPIC_API_KEY`` gives ``api_key``/``environment``/``ready``;
  otherwise ``api_key``/``shared_store`` with ``ready`` (stored key), ``needs_login``
  (record without a usable key) or ``missing``.
- custom with ``api_key_env``: ``api_key``/``environment``, ``ready`` or ``missing``.
- custom without it: ``none``/``none``/``ready``.

:class:`ReadinessMemo` lets ``status`` answer without re-reading unchanged files: it keeps
each launch context's last answer while the settings files and the auth store show the
same stamps (:mod:`magi_code.storage.stamps`), the environment is equal, and the clock
has not reached an access token's expiry. Both the check of those stamps and the
computation are blocking (``stat`` calls, file reads): ``answer`` runs in a worker thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

from magi_code.auth.store import AuthSnapshot, AuthStore
from magi_code.auth.tokens import (
    ANTHROPIC_PROVIDER_ID,
    BUILTIN_PROVIDER_IDS,
    CODEX_PROVIDER_ID,
    access_usable,
    api_key,
    oauth_fields,
)
from magi_code.dataclass import dataclass
from magi_code.protocol.errors import ServiceError
from magi_code.storage.launch import LaunchContext
from magi_code.storage.stamps import RACY_WINDOW_NS, Probe, probe, trusted


class ProviderLike(Protocol):
    """What auth needs from a configured provider definition (config layer owns the type)."""

    @property
    def provider_id(self) -> str: ...

    @property
    def api_key_env(self) -> str | None: ...


def env_value(env: Mapping[str, str], name: str | None) -> str | None:
    """A nonblank environment value (surrounding whitespace dropped), else ``None``."""
    value = env.get(name, "").strip() if name else ""
    return value or None


def _entry(provider_id: str, method: str, source: str, readiness: str) -> dict[str, Any]:
    return {
        "provider_id": provider_id,
        "auth_method": method,
        "source": source,
        "readiness": readiness,
        "ready": readiness == "ready",
    }


def _codex(snapshot: AuthSnapshot, now: float) -> dict[str, Any]:
    record = snapshot.record(CODEX_PROVIDER_ID)
    if record is None:
        readiness = "missing"
    else:
        _, refresh, _ = oauth_fields(record)
        usable = refresh is not None or access_usable(record, now)
        readiness = "ready" if usable else "needs_login"
    return _entry(CODEX_PROVIDER_ID, "oauth", "shared_store", readiness)


def _anthropic(env: Mapping[str, str], snapshot: AuthSnapshot) -> dict[str, Any]:
    if env_value(env, "ANTHROPIC_API_KEY") is not None:
        return _entry(ANTHROPIC_PROVIDER_ID, "api_key", "environment", "ready")
    record = snapshot.record(ANTHROPIC_PROVIDER_ID)
    if record is None:
        readiness = "missing"
    else:
        readiness = "ready" if api_key(record) is not None else "needs_login"
    return _entry(ANTHROPIC_PROVIDER_ID, "api_key", "shared_store", readiness)


def _custom(env: Mapping[str, str], provider: ProviderLike) -> dict[str, Any]:
    if not provider.api_key_env:
        return _entry(provider.provider_id, "none", "none", "ready")
    readiness = "ready" if env_value(env, provider.api_key_env) is not None else "missing"
    return _entry(provider.provider_id, "api_key", "environment", readiness)


def provider_status(
    ctx: LaunchContext,
    providers: Iterable[ProviderLike],
    snapshot: AuthSnapshot,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """The ``auth.status`` ``providers`` array: built-ins first, then custom ones by ID."""
    at = time.time() if now is None else now
    entries = [_codex(snapshot, at), _anthropic(ctx.env, snapshot)]
    custom = {p.provider_id: p for p in providers if p.provider_id not in BUILTIN_PROVIDER_IDS}
    entries.extend(_custom(ctx.env, custom[pid]) for pid in sorted(custom))
    return entries


def is_ready(
    ctx: LaunchContext,
    provider: ProviderLike | str,
    snapshot: AuthSnapshot,
    now: float | None = None,
) -> bool:
    """``status.provider_auth_ready`` for the selected provider (unknown IDs are not ready)."""
    at = time.time() if now is None else now
    provider_id = provider if isinstance(provider, str) else provider.provider_id
    if provider_id == CODEX_PROVIDER_ID:
        return bool(_codex(snapshot, at)["ready"])
    if provider_id == ANTHROPIC_PROVIDER_ID:
        return bool(_anthropic(ctx.env, snapshot)["ready"])
    if isinstance(provider, str):
        return False
    return bool(_custom(ctx.env, provider)["ready"])


def time_bound(snapshot: AuthSnapshot, now: float) -> float | None:
    """The first instant after ``now`` at which a readiness answer from ``snapshot`` can
    change with the clock alone, or ``None`` when none can.

    Only an OAuth record without a refresh token depends on the clock: its access token
    is usable until ``expires_at`` (see :func:`access_usable`), then it needs a login.
    """
    bound: float | None = None
    for record in snapshot.records.values():
        access, refresh, expires = oauth_fields(record)
        if refresh is None and access is not None and expires is not None and expires > now:
            bound = expires if bound is None else min(bound, expires)
    return bound


# The ``status.provider_auth_ready`` check (``ServiceError`` when settings or auth cannot
# be read). Contract for memoizing it: its answer is a function of the global and project
# settings files, the shared auth store, ``ctx.env`` and the clock, and the clock counts
# only through the access tokens' expiries (:func:`time_bound`); it writes nothing.
ReadinessCheck = Callable[[LaunchContext], bool]

# Launch contexts (home and project) remembered, and environments per context.
MAX_MEMO_CONTEXTS: Final = 32
MAX_MEMO_ENVIRONMENTS: Final = 4


@dataclass(frozen=True, slots=True)
class _Answer:
    env: dict[str, str]
    probes: tuple[Probe, ...]
    ready: bool
    # The answer holds for a clock in [since, until); ``until`` None: no expiry involved.
    since: float
    until: float | None


class ReadinessMemo:
    """A :data:`ReadinessCheck` that re-reads files only when their stamps changed.

    :meth:`answer` is the check's answer: :meth:`cached`, the remembered answer (a
    dictionary lookup, an environment comparison and a few ``stat`` calls), or ``None``
    when it must be computed; then :meth:`compute`, which runs the check and remembers
    the answer unless a file changed within the stamps' racy window, so a file written in
    place twice within one timestamp tick is read again. Errors are never remembered.
    All three block (call them off the event loop); safe to use from several threads.
    """

    def __init__(
        self,
        check: ReadinessCheck,
        *,
        clock: Callable[[], float] = time.time,
        clock_ns: Callable[[], int] = time.time_ns,
        racy_window_ns: int = RACY_WINDOW_NS,
    ) -> None:
        self._check = check
        self._clock = clock
        self._clock_ns = clock_ns
        self._window = racy_window_ns
        self._lock = threading.Lock()
        self._answers: OrderedDict[tuple[str, str], list[_Answer]] = OrderedDict()

    @staticmethod
    def _key(ctx: LaunchContext) -> tuple[str, str]:
        return (str(ctx.mc_home), str(ctx.project_dir))

    @staticmethod
    def _probes(key: tuple[str, str]) -> tuple[Probe, ...]:
        home, project = key
        return (
            # Settings are read through a symlink; the auth store refuses one.
            probe(f"{home}/settings.json"),
            probe(f"{project}/.magi-code/settings.json"),
            probe(f"{home}/auth.json", follow_symlinks=False),
        )

    def answer(self, ctx: LaunchContext) -> bool:
        """The remembered answer where it still holds, else the check's.

        Raises:
            ServiceError: whatever the check raises.
        """
        ready = self.cached(ctx)
        return self.compute(ctx) if ready is None else ready

    def cached(self, ctx: LaunchContext) -> bool | None:
        """The remembered answer if nothing it depends on changed, else ``None``."""
        key = self._key(ctx)
        with self._lock:
            answers = self._answers.get(key)
            if answers is None:
                return None
            answer = next((a for a in answers if a.env == ctx.env), None)
            if answer is None:
                return None
            self._answers.move_to_end(key)
        now = self._clock()
        if now < answer.since or (answer.until is not None and now >= answer.until):
            return None
        for item in answer.probes:
            if not item.unchanged():
                return None
        return answer.ready

    def compute(self, ctx: LaunchContext) -> bool:
        """Run the check and remember its answer when the stamps can vouch for it.

        Raises:
            ServiceError: whatever the check raises (nothing is remembered).
        """
        key = self._key(ctx)
        env = dict(ctx.env)
        start = self._clock()
        taken = self._clock_ns()
        # Probes come before the reads: a change during the check leaves a stamp that no
        # longer matches, so the next request computes again.
        try:
            probes: tuple[Probe, ...] | None = self._probes(key)
        except OSError:
            probes = None
        ready = self._check(ctx)
        if probes is None or not trusted(probes, taken, self._window):
            return ready
        try:
            until = time_bound(AuthStore(ctx.auth_path).read(), start)
        except ServiceError:  # an unreadable store: the check decides, nothing is kept
            return ready
        answer = _Answer(env, probes, ready, self._clock(), until)
        with self._lock:
            answers = self._answers.pop(key, [])
            answers = [answer, *(a for a in answers if a.env != env)][:MAX_MEMO_ENVIRONMENTS]
            self._answers[key] = answers
            while len(self._answers) > MAX_MEMO_CONTEXTS:
                self._answers.popitem(last=False)
        return ready
