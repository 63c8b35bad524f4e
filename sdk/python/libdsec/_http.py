"""Client and AsyncClient: a connection pool to one DSec server, with retries.

Sandboxes made without an explicit client share one Client per (url, token)
(and one AsyncClient per (url, token, event loop), since an httpx.AsyncClient
belongs to the loop that used it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Iterator, TypeVar

import httpx

from ._calls import Call, error_retry_delay, transport_retry_delay
from ._config import ClientOptions, DEFAULT_REQUEST_TIMEOUT, resolve_token, resolve_url, split_urls
from ._ops import Op
from ._version import __version__
from .errors import SandboxError, error_from_response, wrap_transport_error

if TYPE_CHECKING:
    from .trajectories import AsyncSnapshots, AsyncTrajectories, Snapshots, Trajectories

T = TypeVar("T")

__all__ = ["Client", "AsyncClient"]


class _Base:
    """What Client and AsyncClient share: options, headers, request building."""

    _default_max_connections = 100
    # Idle connections kept open; None: as many as max_connections.
    _default_max_keepalive: int | None = None

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_connections: int | None = None,
        max_keepalive_connections: int | None = None,
        max_retries: int = 10,
        backoff_base: float = 0.2,
        backoff_max: float = 10.0,
        retry_after_max: float = 60.0,
        retry_timeout: float | None = 120.0,
    ) -> None:
        self.options = ClientOptions(
            url=resolve_url(url),
            token=resolve_token(token),
            request_timeout=request_timeout,
            max_connections=max_connections or self._default_max_connections,
            max_keepalive_connections=max_keepalive_connections or self._default_max_keepalive,
            max_retries=max_retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            retry_after_max=retry_after_max,
            retry_timeout=retry_timeout,
        )
        self._closed = False
        # The API servers, and the one in use: a call that fails in a way
        # it retries because of the server (unreachable, or 503) retries
        # on the next one, and the client stays there.
        self._urls = split_urls(self.options.url)
        self._server = 0

    def _failover(self, server: int) -> None:
        if self._server == server and len(self._urls) > 1:
            self._server = (server + 1) % len(self._urls)

    @property
    def url(self) -> str:
        """The server URL (several, comma-separated, if the client was given several)."""
        return self.options.url

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r})"

    def _client_kwargs(self) -> dict[str, Any]:
        o = self.options
        return {
            "base_url": self._urls[0],
            "headers": {
                "Authorization": f"Bearer {o.token}",
                "User-Agent": f"libdsec/{__version__}",
                "Accept": "application/json",
            },
            "limits": httpx.Limits(
                max_connections=o.max_connections,
                max_keepalive_connections=o.max_keepalive_connections or o.max_connections,
                keepalive_expiry=o.keepalive_expiry,
            ),
            "timeout": self._timeout(o.request_timeout),
            "follow_redirects": False,
            "trust_env": True,
        }

    def _timeout(self, seconds: float) -> httpx.Timeout:
        # No pool timeout: waiting for a free connection is back-pressure,
        # not a failure; the request's own timeouts start once it has one.
        return httpx.Timeout(seconds, connect=min(seconds, self.options.connect_timeout), pool=None)

    def _build_kwargs(self, call: Call, content: Any) -> dict[str, Any]:
        headers = dict(call.headers)
        kw: dict[str, Any] = {"params": call.params or None, "timeout": self._timeout(call.timeout)}
        if call.json is not None:
            kw["json"] = call.json
        if call.body is not None:
            kw["content"] = content
            headers.update(call.body.headers)
        if headers:
            kw["headers"] = headers
        return kw


_NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


class _NoDelayBackend:
    """A sync network backend whose TCP connections send at once.

    httpcore's sync backend leaves Nagle's algorithm on, and it writes a
    request's headers and body in separate sends: the body then waits for
    the server's delayed ACK of the headers, 40 ms on Linux, on every call
    with a body (measured: exec round trip 44 ms sync, 2 ms async, whose
    backend sets TCP_NODELAY). For httpx < 0.24.1, which has no
    socket_options.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def connect_tcp(self, *args: Any, **kwargs: Any) -> Any:
        stream = self._inner.connect_tcp(*args, **kwargs)
        sock = stream.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(*_NODELAY[0])
        return stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _sync_transport(limits: httpx.Limits) -> httpx.HTTPTransport:
    """An HTTP transport whose connections have TCP_NODELAY set."""
    try:
        return httpx.HTTPTransport(limits=limits, socket_options=_NODELAY)  # type: ignore[call-arg]
    except TypeError:  # httpx < 0.24.1
        t = httpx.HTTPTransport(limits=limits)
        pool = getattr(t, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is not None:
            pool._network_backend = _NoDelayBackend(backend)  # type: ignore[union-attr]
        return t


class Client(_Base):
    """A connection pool to one DSec server, for :class:`~libdsec.Sandbox`.

    Safe for use from many threads. Pass it as ``client=`` to ``Sandbox.create``
    and friends to choose its settings; otherwise they share
    ``Client.shared(url, token)``. Close it with :meth:`close` (or ``with``).

    Args:
        url: server URL; default $DSEC_URL, else http://127.0.0.1:7878.
        token: API token; default $DSEC_TOKEN, else /var/lib/dsec/token.
        request_timeout: default timeout of a request, in seconds.
        max_connections: size of the pool (default 100).
        max_retries: retries for 429 (honouring Retry-After), 503 with
            Retry-After, and connection failures where a retry is safe
            (default 10).
        retry_timeout: no retry starts this many seconds after a call's
            first attempt (default 120; None: only max_retries bounds them).
    """

    _shared: dict[tuple[str, str], Client] = {}
    _shared_lock = threading.Lock()

    def __init__(self, url: str | None = None, token: str | None = None, **options: Any) -> None:
        super().__init__(url, token, **options)
        kw = self._client_kwargs()
        kw["transport"] = _sync_transport(kw["limits"])
        self._http = httpx.Client(**kw)

    @classmethod
    def shared(cls, url: str | None = None, token: str | None = None) -> Client:
        """The pool shared by every sandbox of this (url, token)."""
        key = (resolve_url(url), resolve_token(token))
        with cls._shared_lock:
            c = cls._shared.get(key)
            if c is None or c.closed:
                c = cls._shared[key] = cls(*key)
            return c

    @classmethod
    def close_shared(cls) -> None:
        """Close every shared pool (new sandboxes open new ones)."""
        with cls._shared_lock:
            clients = list(cls._shared.values())
            cls._shared.clear()
        for c in clients:
            c.close()

    def close(self) -> None:
        self._closed = True
        self._http.close()

    @property
    def trajectories(self) -> Trajectories:
        """The token's trajectories: get, list, steps, export, blob, delete."""
        from .trajectories import Trajectories

        return Trajectories(self)

    @property
    def snapshots(self) -> Snapshots:
        """The token's snapshots: get, delete."""
        from .trajectories import Snapshots

        return Snapshots(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, call: Call, *, stream: bool = False) -> httpx.Response:
        """Send call, retrying as the options allow; raise SandboxError on failure.

        With stream=True the body is not read: the caller must close the
        response.
        """
        attempt = 0
        start = time.monotonic()
        while True:
            content = call.body.sync_content() if call.body is not None else None
            server = self._server
            request = self._http.build_request(call.method, self._urls[server] + call.path, **self._build_kwargs(call, content))
            try:
                resp = self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                delay = transport_retry_delay(self.options, call, exc, attempt, time.monotonic() - start)
                if delay is None or not call.can_resend():
                    raise wrap_transport_error(exc, call.what) from exc
                self._failover(server)
            else:
                if resp.status_code < 400:
                    return resp
                try:
                    resp.read()
                except httpx.TransportError:
                    pass
                finally:
                    resp.close()
                err = error_from_response(resp)
                delay = error_retry_delay(self.options, call, err, attempt, time.monotonic() - start)
                if delay is None or not call.can_resend():
                    raise err
                if resp.status_code == 503:
                    self._failover(server)  # a 429 is the token's, the same everywhere
            time.sleep(delay)
            attempt += 1

    def run(self, op: Op[T]) -> T:
        """Drive an operation generator to its result."""
        try:
            call = next(op)
            while True:
                try:
                    resp = self.send(call)
                except SandboxError as err:
                    call = op.throw(err)
                else:
                    call = op.send(resp)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            op.close()


class AsyncClient(_Base):
    """A connection pool to one DSec server, for :class:`~libdsec.AsyncSandbox`.

    Like :class:`Client`, on ``httpx.AsyncClient``; the pool defaults to 1000
    connections so that a thousand concurrent sandboxes do not queue, of
    which 32 are kept open while idle (``max_keepalive_connections``). It
    belongs to the event loop that first uses it. Close it with
    ``await client.aclose()`` (or ``async with``); close the shared ones of
    the running loop with ``await AsyncClient.aclose_shared()``.
    """

    _default_max_connections = 1000
    # httpx's pool checks every idle connection on each request (a few
    # system calls each): with a thousand kept idle, an asyncio burst of
    # creates spent more CPU in the client than the server did. Fewer
    # idle ones cost a reconnect now and then.
    _default_max_keepalive = 32
    _shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], AsyncClient]] = (
        weakref.WeakKeyDictionary()
    )
    _shared_lock = threading.Lock()

    def __init__(self, url: str | None = None, token: str | None = None, **options: Any) -> None:
        super().__init__(url, token, **options)
        self._http = httpx.AsyncClient(**self._client_kwargs())

    @classmethod
    def shared(cls, url: str | None = None, token: str | None = None) -> AsyncClient:
        """The pool shared by every sandbox of this (url, token) on the running loop."""
        loop = asyncio.get_running_loop()
        key = (resolve_url(url), resolve_token(token))
        with cls._shared_lock:
            clients = cls._shared.setdefault(loop, {})
            c = clients.get(key)
            if c is None or c.closed:
                c = clients[key] = cls(*key)
            return c

    @classmethod
    async def aclose_shared(cls) -> None:
        """Close the shared pools of the running loop."""
        loop = asyncio.get_running_loop()
        with cls._shared_lock:
            clients = list(cls._shared.pop(loop, {}).values())
        for c in clients:
            await c.aclose()

    async def aclose(self) -> None:
        self._closed = True
        await self._http.aclose()

    @property
    def trajectories(self) -> AsyncTrajectories:
        """As Client.trajectories."""
        from .trajectories import AsyncTrajectories

        return AsyncTrajectories(self)

    @property
    def snapshots(self) -> AsyncSnapshots:
        """As Client.snapshots."""
        from .trajectories import AsyncSnapshots

        return AsyncSnapshots(self)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def send(self, call: Call, *, stream: bool = False) -> httpx.Response:
        """As Client.send."""
        attempt = 0
        start = time.monotonic()
        while True:
            content = call.body.async_content() if call.body is not None else None
            server = self._server
            request = self._http.build_request(call.method, self._urls[server] + call.path, **self._build_kwargs(call, content))
            try:
                resp = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                delay = transport_retry_delay(self.options, call, exc, attempt, time.monotonic() - start)
                if delay is None or not call.can_resend():
                    raise wrap_transport_error(exc, call.what) from exc
                self._failover(server)
            else:
                if resp.status_code < 400:
                    return resp
                try:
                    await resp.aread()
                except httpx.TransportError:
                    pass
                finally:
                    await resp.aclose()
                err = error_from_response(resp)
                delay = error_retry_delay(self.options, call, err, attempt, time.monotonic() - start)
                if delay is None or not call.can_resend():
                    raise err
                if resp.status_code == 503:
                    self._failover(server)  # a 429 is the token's, the same everywhere
            await asyncio.sleep(delay)
            attempt += 1

    async def run(self, op: Op[T]) -> T:
        """As Client.run."""
        try:
            call = next(op)
            while True:
                try:
                    resp = await self.send(call)
                except SandboxError as err:
                    call = op.throw(err)
                else:
                    call = op.send(resp)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            op.close()


@contextlib.contextmanager
def wrap_transport(what: str) -> Iterator[None]:
    """Turn httpx transport failures while reading a stream into SandboxErrors."""
    try:
        yield
    except httpx.TransportError as exc:
        raise wrap_transport_error(exc, what) from exc
