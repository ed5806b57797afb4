"""What every wire-API module provides, plus small JSON helpers they share.

Each API module exposes ``build_call(endpoint, request) -> HttpCall`` and a ``Decoder``
class: ``feed(event)`` turns one SSE event into neutral stream events, ``done`` says the
API's terminal event arrived (stop reading), and ``finish()`` is called at EOF and
raises ``provider_stream_error`` when the terminal event never came.

A request resends the whole conversation, and a tool loop sends it again after every
reply. Each API module therefore builds its messages item by item (a ``Messages``
builder: which messages later items can no longer change is part of the API's rules),
and ``messages_value`` gives them in the form the body wants: a plain list, or, with the
request's ``MessageCache``, the encoded array built from the previous request's, where
only the messages of the new items (and those still open) are built and encoded. That
array is sent as the chunks the cache keeps (``HttpCall.content``), not copied into the
body: a request holds its conversation once, not three times.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol

import orjson

from magi_code.dataclass import dataclass
from magi_code.providers.errors import FailureLabel, ProviderFailure
from magi_code.providers.sse import SSEEvent
from magi_code.providers.types import ConversationItem, ProviderRequest, StreamEvent

JsonObject = dict[str, object]

# Reasoning levels as OpenAI efforts (chat ``reasoning_effort``, Responses
# ``reasoning.effort``); ``default`` sends none, and the two top levels share ``xhigh``.
REASONING_EFFORT: Final[dict[str, str]] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "x_high": "xhigh",
    "max": "xhigh",
}


# How the message cache keeps its encoded messages: large enough that a long conversation
# is a few dozen chunks, small enough that a request's copy of the last one is cheap. A
# body no larger goes as one chunk (one write).
BLOCK_BYTES: Final = 64 * 1024


class EncodedArray:
    """A JSON array already encoded, as the chunks that make it up in order.

    Not a dataclass: orjson encodes those itself, and ``HttpCall.content`` needs it to
    ask its ``default`` for this one."""

    __slots__ = ("chunks",)

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks


# orjson escapes every control character in strings, so this byte appears in an encoded
# body only where an ``EncodedArray``'s placeholder put it.
_SPLICE: Final = b"\x00"
_PLACEHOLDER: Final = orjson.Fragment(_SPLICE)


@dataclass(frozen=True, slots=True)
class HttpCall:
    url: str
    headers: Mapping[str, str]
    body: JsonObject  # JSON values; a message cache's messages are an ``EncodedArray``

    def content(self) -> list[bytes]:
        """The encoded body as the chunks to send: an ``EncodedArray``'s own chunks go
        between the rest's, uncopied (but in a body of at most ``BLOCK_BYTES``)."""
        arrays: list[EncodedArray] = []

        def splice(value: object) -> orjson.Fragment:
            if not isinstance(value, EncodedArray):
                raise TypeError
            arrays.append(value)  # (in the order the body has them)
            return _PLACEHOLDER

        encoded = orjson.dumps(self.body, default=splice)
        if not arrays:
            return [encoded]
        parts = encoded.split(_SPLICE)
        content = [parts[0]]
        for placed, after in zip(arrays, parts[1:], strict=True):
            content += placed.chunks
            content.append(after)
        return content if sum(map(len, content)) > BLOCK_BYTES else [b"".join(content)]


class Decoder(Protocol):
    @property
    def done(self) -> bool: ...

    def feed(self, event: SSEEvent) -> list[StreamEvent]: ...

    def finish(self) -> list[StreamEvent]: ...


def load_object(data: str) -> JsonObject:
    """Parse one event's JSON payload; anything but an object is a stream error."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ProviderFailure(FailureLabel.STREAM_ERROR) from None
    if not isinstance(value, dict):
        raise ProviderFailure(FailureLabel.STREAM_ERROR)
    return value


def obj(value: object) -> JsonObject:
    return value if isinstance(value, dict) else {}


def text(value: object) -> str:
    return value if isinstance(value, str) else ""


def count(value: object) -> int | None:
    """A token count, or ``None`` when absent or not a non-negative integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def merged_headers(endpoint_headers: Mapping[str, str], **extra: str) -> dict[str, str]:
    """Protocol headers first; the endpoint's own (auth, overrides) win on conflicts."""
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    headers.update({k.replace("_", "-"): v for k, v in extra.items()})
    lowered = {k.lower() for k in endpoint_headers}
    headers = {k: v for k, v in headers.items() if k not in lowered}
    headers.update(endpoint_headers)
    return headers


def dumps(value: object) -> str:
    return orjson.dumps(value).decode()


class Messages(Protocol):
    """A wire API's messages of a conversation, built one item at a time."""

    @property
    def done(self) -> list[JsonObject]:
        """The leading messages no later item can change; ``add`` only appends to it (a
        ``MessageCache`` takes from its front the messages it has encoded)."""

    def add(self, item: ConversationItem) -> None: ...

    def rest(self) -> list[JsonObject]:
        """The messages after ``done`` as they stand now (later items may change them;
        ``marks`` never do)."""


# Messages the request sends changed: index -> what goes there instead (a copy). A mark
# goes on one of the last ``MARKS_REACH`` messages; with a ``MessageCache`` it is given
# only those (and the indexes are theirs).
Marks = Callable[[list[JsonObject]], dict[int, JsonObject]]
MARKS_REACH: Final = 4


def _unmarked(messages: list[JsonObject]) -> dict[int, JsonObject]:
    return {}


def messages_value(
    request: ProviderRequest,
    builder: Callable[..., Messages],
    *arguments: object,
    marks: Marks = _unmarked,
) -> object:
    """The messages of ``request.items`` as ``builder(*arguments)`` makes them, with
    ``marks`` applied: a list, or with ``request.message_cache`` the encoded array."""
    if request.message_cache is not None:
        return request.message_cache.array(request.items, builder, arguments, marks)
    messages = builder(*arguments)
    for item in request.items:
        messages.add(item)
    sent = [*messages.done, *messages.rest()]
    for index, message in marks(sent).items():
        sent[index] = message
    return sent


class MessageCache:
    """One conversation's messages, kept encoded between its requests.

    Give every request of one conversation (an agent's turn) the same cache. A
    conversation only grows between requests, or is replaced whole (a compaction): each
    request checks that its items begin with the ones the cache has seen (the same
    objects, or equal ones) and that the builder and its arguments are the same; anything
    else starts again from nothing. The array's chunks, joined, equal ``orjson.dumps`` of
    the list ``messages_value`` gives without a cache, byte for byte.

    A message, once encoded, is kept only as its bytes (but the last ``MARKS_REACH``,
    which marks may change): a turn holds its conversation once, encoded, not also as
    the objects it was built from. The bytes are kept in blocks of about
    :data:`BLOCK_BYTES` that every request sends as they are: a request copies only what
    it encodes again and the last, unfinished block.
    """

    def __init__(self, block_bytes: int = BLOCK_BYTES) -> None:
        self._block_bytes = block_bytes
        self.clear()

    def clear(self) -> None:
        """Forget the conversation (its end: what is kept is as large as it is)."""
        self._builder: Callable[..., Messages] | None = None
        self._arguments: tuple[object, ...] = ()
        self._messages: Messages | None = None
        self._items: list[ConversationItem] = []
        # The done messages encoded, comma-separated: the full blocks, then the block being
        # filled; and where each message starts in them.
        self._blocks: list[bytes] = []
        self._open = bytearray()
        self._sealed = 0  # the bytes in ``_blocks``
        self._starts = array("q")
        self._taken = 0  # the done messages taken from the builder's list (encoded)

    def array(
        self,
        items: Sequence[ConversationItem],
        builder: Callable[..., Messages],
        arguments: tuple[object, ...],
        marks: Marks,
    ) -> EncodedArray:
        seen, now = self._items, list(items)
        if (
            self._messages is None
            or builder is not self._builder
            or arguments != self._arguments
            or now[: len(seen)] != seen  # (list equality: identity first, then ==)
        ):
            self.clear()
            self._builder, self._arguments = builder, arguments
            self._messages, seen = builder(*arguments), []
        messages = self._messages
        for item in now[len(seen) :]:
            messages.add(item)
            self._take_done(messages.done)
        self._take_done(messages.done)  # (a builder may start with some)
        self._items = now
        done, starts, taken = messages.done, self._starts, self._taken
        # ``done[i]`` and ``rest[i]`` are the request's messages ``taken + i`` and
        # ``len(starts) + i``.
        rest = messages.rest()
        marked = marks([*done, *rest]) if marks is not _unmarked else {}
        # Encoded again: the open messages, and every kept one from the first marked on.
        cut = min((taken + i for i in marked if i < len(done)), default=len(starts))
        again = [
            orjson.dumps(marked.get(i - taken, m))
            for i, m in enumerate(done[cut - taken :] + rest, cut)
        ]
        end = starts[cut] - (cut > 0) if cut < len(starts) else self._sealed + len(self._open)
        separator = b"," if cut > 0 and again else b""
        chunks = [b"[", *self._kept(end), separator, b",".join(again), b"]"]
        return EncodedArray([chunk for chunk in chunks if chunk])

    def _take_done(self, done: list[JsonObject]) -> None:
        """Encode the done messages not yet encoded, and take all but the last
        ``MARKS_REACH`` from the builder: as each item is added, so that a long
        conversation's first request never holds all its messages as objects at once."""
        starts = self._starts
        for message in done[len(starts) - self._taken :]:
            if starts:
                self._open += b","
            starts.append(self._sealed + len(self._open))
            self._open += orjson.dumps(message)
            if len(self._open) >= self._block_bytes:
                self._blocks.append(bytes(self._open))
                self._sealed += len(self._open)
                self._open = bytearray()
        if len(done) > MARKS_REACH:
            self._taken += len(done) - MARKS_REACH
            del done[:-MARKS_REACH]

    def _kept(self, end: int) -> list[bytes]:
        """The first ``end`` bytes of the encoded messages: the blocks before it as they
        are, then a copy of the rest (of one block, or of the block being filled)."""
        chunks: list[bytes] = []
        for block in self._blocks:
            if len(block) > end:
                return [*chunks, block[:end]] if end else chunks
            chunks.append(block)
            end -= len(block)
        return [*chunks, bytes(self._open[:end])] if end else chunks
