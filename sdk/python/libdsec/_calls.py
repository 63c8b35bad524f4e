"""What one HTTP request is (Call, Body) and when to retry it.

Nothing here does I/O on the network, so the sync and async clients share it.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator, Protocol, Union

import httpx

from ._config import ClientOptions
from .errors import RateLimitError, SandboxError, ServerError

CHUNK_SIZE = 1 << 20



class SupportsRead(Protocol):
    """A file-like object: binary (read returns bytes) or text (str, sent as UTF-8)."""

    def read(self, size: int, /) -> bytes | str: ...


BodyData = Union[str, bytes, bytearray, memoryview, SupportsRead]


class Body:
    """A request body: bytes, a file-like object streamed in chunks, or an
    iterator of byte chunks (``chunks=``, sent as they come).

    File-like objects are never read into memory whole. A seekable one can be
    rewound and sent again (for a retry after 429); others, and iterators,
    cannot.
    """

    def __init__(
        self,
        data: BodyData | None = None,
        *,
        chunks: Iterator[bytes] | None = None,
        content_type: str = "application/octet-stream",
    ) -> None:
        self._bytes: bytes | None = None
        self._file: Any = None
        self._chunks = chunks
        self._start: int | None = None
        self._text = False
        self.length: int | None = None
        self.content_type = content_type
        if chunks is not None:
            if data is not None:
                raise TypeError("pass data or chunks, not both")
        elif isinstance(data, str):
            self._bytes = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            self._bytes = bytes(data)
        elif hasattr(data, "read"):
            self._file = data
            self._text = isinstance(data, io.TextIOBase)
            self._probe_file()
        else:
            raise TypeError(f"data must be str, bytes or a file-like object, not {type(data).__name__}")
        if self._bytes is not None:
            self.length = len(self._bytes)
        self._sent = False

    def _probe_file(self) -> None:
        """Note where a seekable file starts, and its length in bytes if known."""
        f = self._file
        try:
            if not f.seekable():
                return
            start: int = f.tell()
        except (AttributeError, OSError, ValueError):
            return
        self._start = start
        if self._text:
            return  # the byte length of text is not known in advance
        try:
            self.length = os.fstat(f.fileno()).st_size - start
            return
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            pass
        try:
            end: int = f.seek(0, io.SEEK_END)
            f.seek(start)
            self.length = end - start
        except (OSError, ValueError):
            self.length = None

    @property
    def headers(self) -> dict[str, str]:
        h = {"Content-Type": self.content_type}
        if self.length is not None:
            h["Content-Length"] = str(self.length)
        return h

    def rewind(self) -> bool:
        """Prepare to be sent again; False if that is impossible."""
        if self._bytes is not None or not self._sent:
            return True
        if self._chunks is not None or self._start is None:
            return False
        try:
            self._file.seek(self._start)
        except (OSError, ValueError):
            return False
        return True

    def _chunk(self, data: Any) -> bytes:
        return data.encode("utf-8") if isinstance(data, str) else bytes(data)

    def sync_content(self) -> bytes | Iterator[bytes]:
        self._sent = True
        if self._bytes is not None:
            return self._bytes
        if self._chunks is not None:
            return self._chunks
        return self._iter_file()

    def _iter_file(self) -> Iterator[bytes]:
        while True:
            data = self._file.read(CHUNK_SIZE)
            if not data:
                return
            yield self._chunk(data)

    def async_content(self) -> bytes | AsyncIterator[bytes]:
        self._sent = True
        if self._bytes is not None:
            return self._bytes
        if self._chunks is not None:
            return self._aiter_chunks(self._chunks)
        return self._aiter_file()

    @staticmethod
    async def _aiter_chunks(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
        # Each chunk in a thread: producing it may read files.
        while True:
            data = await asyncio.to_thread(_next_chunk, chunks)
            if data is None:
                return
            yield data

    async def _aiter_file(self) -> AsyncIterator[bytes]:
        while True:
            # A thread, so that a slow disk does not stall the event loop.
            data = await asyncio.to_thread(self._file.read, CHUNK_SIZE)
            if not data:
                return
            yield self._chunk(data)


def _next_chunk(chunks: Iterator[bytes]) -> bytes | None:
    """The next chunk, or None at the end."""
    return next(chunks, None)


@dataclass
class Call:
    """One API request, independent of how it is sent."""

    method: str
    path: str
    timeout: float
    params: list[tuple[str, str]] = field(default_factory=list)
    json: Any = None
    body: Body | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def what(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def idempotent(self) -> bool:
        """Whether sending the call again cannot repeat its effect: a GET or
        DELETE, or a create that carries a request_id (an idempotency key)."""
        if isinstance(self.json, dict) and self.json.get("request_id"):
            return True
        return self.method in ("GET", "HEAD", "DELETE")

    def can_resend(self) -> bool:
        return self.body is None or self.body.rewind()


def backoff(opts: ClientOptions, attempt: int, retry_after: float | None = None) -> float:
    """Seconds to wait before retry number attempt (0-based).

    Exponential (backoff_base doubling, at most backoff_max), jittered over
    its upper half; or, when the server said when to come back and that is
    longer, its Retry-After plus up to a quarter more at random, so that
    many clients told the same do not all come back in the same instant.
    """
    delay: float = min(opts.backoff_max, opts.backoff_base * (2**min(attempt, 32)))
    if retry_after is None or retry_after <= 0:
        return delay * random.uniform(0.5, 1.0)
    delay = max(delay, retry_after)
    return delay * random.uniform(1.0, 1.25)


def _within(opts: ClientOptions, elapsed: float, delay: float) -> float | None:
    """delay, or None if waiting it would pass the call's retry budget."""
    if opts.retry_timeout is not None and elapsed + delay > opts.retry_timeout:
        return None
    return delay


def error_retry_delay(
    opts: ClientOptions, call: Call, err: SandboxError, attempt: int, elapsed: float = 0.0
) -> float | None:
    """Seconds to wait before retrying call after the server answered err, or None.

    elapsed is the time since the call's first attempt; no retry starts past
    the retry budget (ClientOptions.retry_timeout). Retried:

    - 429: the server did not act on the request (it is overloaded, or
      rate-limits the token), except ``too_many_sandboxes``, which lasts
      until the caller deletes sandboxes;
    - 503 with Retry-After: the server did nothing and says when to come
      back (e.g. a create that could not start for a transient reason);
      503 without it only for idempotent requests.

    Retry-After is honoured; a longer one than retry_after_max is not
    waited for.
    """
    if attempt >= opts.max_retries:
        return None
    if isinstance(err, RateLimitError):
        if err.code == "too_many_sandboxes":
            return None
        retry_after = err.retry_after
    elif isinstance(err, ServerError) and err.status == 503:
        retry_after = err.retry_after
        if retry_after is None and not call.idempotent:
            return None
    else:
        return None
    if retry_after is not None and retry_after > opts.retry_after_max:
        return None
    return _within(opts, elapsed, backoff(opts, attempt, retry_after))


# Failures that happen before the request leaves: safe to retry for any method.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def transport_retry_delay(
    opts: ClientOptions, call: Call, exc: httpx.TransportError, attempt: int, elapsed: float = 0.0
) -> float | None:
    """Seconds to wait before retrying call after a transport failure, or None.

    Connection failures are retried for idempotent requests (GET, DELETE),
    and for any request if it never reached the server. A read timeout is not
    retried: the server is slow, and waiting again would double the wait.
    """
    if attempt >= opts.max_retries:
        return None
    if isinstance(exc, _NOT_SENT):
        return _within(opts, elapsed, backoff(opts, attempt))
    if isinstance(exc, httpx.TimeoutException):
        return None
    if call.idempotent:
        return _within(opts, elapsed, backoff(opts, attempt))
    return None
