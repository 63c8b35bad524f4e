"""Exceptions raised by libdsec.

Every error is a :class:`SandboxError`. Errors from the server carry the
stable ``code`` (e.g. ``"sandbox_not_found"``), the user-facing ``message``,
the error ``class_`` (e.g. ``"not_found"``) and the HTTP ``status`` of the
response; the subclass is chosen from the class, or from the status when the
body is not DSec's JSON error.
"""

from __future__ import annotations

import builtins
import email.utils
import json
import time
from typing import TYPE_CHECKING, Any, Mapping

import httpx

if TYPE_CHECKING:
    from ._models import CommandResult

__all__ = [
    "SandboxError",
    "AuthenticationError",
    "PermissionDeniedError",
    "ReadOnlyError",
    "InvalidArgumentError",
    "NotFoundError",
    "ConflictError",
    "SandboxNotRunningError",
    "PayloadTooLargeError",
    "UnsupportedError",
    "RateLimitError",
    "CommandExitError",
    "TimeoutError",
    "ServerError",
    "ConnectionError",
    "ReplayDivergedError",
    "TrajectoryInFlightError",
    "error_from_response",
    "error_from_body",
]


class SandboxError(Exception):
    """Base class of every libdsec error.

    Attributes:
        message: the message, for people.
        code: stable name of the condition (e.g. ``"path_outside_root"``),
            or ``None`` for errors raised by the SDK itself.
        class_: the server's error class (e.g. ``"invalid_argument"``) or
            ``None``.
        status: the HTTP status of the response, or ``None``.
        request_id: the server's X-Request-Id of the failed request (quote it
            when reporting a problem), or ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        class_: str | None = None,
        status: int | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.class_ = class_
        self.status = status
        self.request_id = request_id

    def __str__(self) -> str:
        parts = []
        if self.status is not None:
            parts.append(str(self.status))
        if self.code:
            parts.append(self.code)
        prefix = " ".join(parts)
        return f"{prefix}: {self.message}" if prefix else self.message

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(message={self.message!r}, code={self.code!r}, "
            f"class_={self.class_!r}, status={self.status!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep every attribute across pickling (multiprocessing pools), which
        # the default, cls(*args), would not.
        return (_rebuild, (type(self), self.args, self.__dict__.copy()))


def _rebuild(cls: type[SandboxError], args: tuple[Any, ...], state: dict[str, Any]) -> SandboxError:
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class AuthenticationError(SandboxError):
    """The token is missing, wrong or revoked (401)."""


class PermissionDeniedError(SandboxError):
    """The sandbox or the server does not permit the operation (403).

    The token is fine: the refusal is the sandbox's (the phase forbids the
    write or the program, the file's permissions refuse it) or the server's
    configuration. ``code`` names the condition, e.g.
    ``"executable_not_allowed"`` or ``"permission_denied"``.
    """


class ReadOnlyError(PermissionDeniedError):
    """A write to a path that is read-only (403): the current phase does not
    list it as writable (``code`` ``"read_only"`` or ``"read_only_path"``),
    or it lies on a read-only file system."""


class InvalidArgumentError(SandboxError):
    """The request is invalid (400), e.g. a path outside the file root."""


class NotFoundError(SandboxError):
    """The sandbox, process or file does not exist (404)."""


class ConflictError(SandboxError):
    """The request conflicts with the current state (409)."""


class SandboxNotRunningError(NotFoundError, ConflictError):
    """The sandbox has ended (killed or expired) but the server still knows it.

    The server classes this as a conflict (409, code ``sandbox_not_running``);
    it is also a NotFoundError, so that ``except NotFoundError`` catches a
    sandbox that is gone, whether or not the server still remembers it.
    """


class ReplayDivergedError(ConflictError):
    """A replayed step's result differed from the trajectory's log (409,
    code ``replay_diverged``); the resumed sandbox was kept where it
    diverged."""


class PayloadTooLargeError(SandboxError):
    """The upload or request is larger than the server accepts (413)."""


class UnsupportedError(SandboxError):
    """The operation is not supported on this sandbox's tier (422).

    The message names the tier and the operation.
    """


class RateLimitError(SandboxError):
    """Too many requests (429), after the SDK's own retries ran out.

    Attributes:
        retry_after: seconds the server asked to wait, or ``None``.
    """

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class ServerError(SandboxError):
    """The server failed or is unavailable (5xx).

    Attributes:
        retry_after: seconds the server asked to wait (some 503s), or ``None``.
    """

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class TrajectoryInFlightError(ServerError):
    """The sandbox is being resumed on another node after its own was lost
    (503, code ``trajectory_in_flight``, with Retry-After), or the command
    was running on the lost node and is not logged as done. The SDK
    retries it like other 503s that carry Retry-After; this is raised once
    the retries run out."""


class _ResultError(SandboxError):
    """An error that carries the outcome of a command, if there was one."""

    def __init__(self, message: str, *, result: CommandResult | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.result = result

    @property
    def stdout(self) -> str:
        return self.result.stdout if self.result else ""

    @property
    def stderr(self) -> str:
        return self.result.stderr if self.result else ""

    @property
    def exit_code(self) -> int | None:
        return self.result.exit_code if self.result else None


class CommandExitError(_ResultError):
    """A command ran and ended with a non-zero exit code (or no exit code).

    Attributes:
        result: the :class:`~libdsec.CommandResult`; ``exit_code``, ``stdout``,
            ``stderr`` and ``error`` are shortcuts to its fields.
    """

    def __init__(self, result: CommandResult) -> None:
        msg = f"command exited with code {result.exit_code}"
        if result.error:
            msg += f" ({result.error})"
        if result.stderr:
            tail = result.stderr[-500:]
            msg += f": {tail}"
        super().__init__(msg, code="command_exit", result=result)

    @property
    def error(self) -> str:
        return self.result.error if self.result else ""


class TimeoutError(_ResultError, builtins.TimeoutError):
    """A command ran out of its timeout, a wait expired, or a request timed out.

    Also an instance of the built-in :class:`TimeoutError`. ``result`` holds
    the command's partial outcome when a command timed out, else ``None``.
    """


class ConnectionError(SandboxError, builtins.ConnectionError):
    """The server could not be reached, or the connection broke."""


_BY_CLASS: dict[str, type[SandboxError]] = {
    "invalid_argument": InvalidArgumentError,
    "unauthenticated": AuthenticationError,
    "permission_denied": PermissionDeniedError,
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "too_large": PayloadTooLargeError,
    "unsupported": UnsupportedError,
    "rate_limited": RateLimitError,
    "deadline_exceeded": TimeoutError,
    "unavailable": ServerError,
    "internal": ServerError,
}

_BY_STATUS: dict[int, type[SandboxError]] = {
    400: InvalidArgumentError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: UnsupportedError,
    429: RateLimitError,
    504: TimeoutError,
}


_BY_CODE: dict[str, type[SandboxError]] = {
    "sandbox_not_running": SandboxNotRunningError,
    "read_only": ReadOnlyError,
    "read_only_path": ReadOnlyError,
    # Trajectories, resume, snapshots and forks.
    "invalid_trajectory_id": InvalidArgumentError,
    "trajectory_not_found": NotFoundError,
    "trajectory_exists": ConflictError,
    "trajectory_full": PayloadTooLargeError,
    "trajectory_running": ConflictError,
    "invalid_fork_count": InvalidArgumentError,
    "snapshot_not_found": NotFoundError,
    "secret_env_missing": InvalidArgumentError,
    "invalid_on_divergence": InvalidArgumentError,
    "replay_diverged": ReplayDivergedError,
    "trajectory_in_flight": TrajectoryInFlightError,
}


def _class_for(code: str | None, class_: str | None, status: int | None) -> type[SandboxError]:
    if code and code in _BY_CODE:
        return _BY_CODE[code]
    if class_ and class_ in _BY_CLASS:
        return _BY_CLASS[class_]
    if status is not None:
        if status in _BY_STATUS:
            return _BY_STATUS[status]
        if status >= 500:
            return ServerError
    return SandboxError


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Return the seconds a Retry-After header asks for (delta or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def error_from_body(
    body: Mapping[str, Any],
    *,
    status: int | None = None,
    retry_after: float | None = None,
) -> SandboxError:
    """Build the exception for a DSec error object ``{"code","message","class"}``."""
    code = body.get("code") if isinstance(body.get("code"), str) else None
    message = body.get("message") if isinstance(body.get("message"), str) else None
    class_ = body.get("class") if isinstance(body.get("class"), str) else None
    cls = _class_for(code, class_, status)
    if not message:
        message = code or (f"HTTP {status}" if status else "error")
    kw: dict[str, Any] = {"code": code, "class_": class_, "status": status}
    if issubclass(cls, (RateLimitError, ServerError)):
        kw["retry_after"] = retry_after
    return cls(message, **kw)


def error_from_response(response: httpx.Response) -> SandboxError:
    """Map an error response (status ≥ 400) to the matching exception.

    The body is expected to be DSec's JSON error; anything else (an HTML page
    from a proxy, an empty body) still gives the right class from the status,
    with the body's start or the reason phrase as the message.
    """
    status = response.status_code
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    try:
        raw = response.content
    except httpx.ResponseNotRead:
        raw = b""
    body: Any = None
    if raw:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
    if not isinstance(body, dict) or not (body.get("code") or body.get("message")):
        text = raw.decode("utf-8", "replace").strip()[:500] if raw else ""
        reason = response.reason_phrase or "error"
        body = {"message": text or f"HTTP {status} {reason}"}
    err = error_from_body(body, status=status, retry_after=retry_after)
    err.request_id = response.headers.get("x-request-id")
    return err


def wrap_transport_error(exc: httpx.TransportError, what: str) -> SandboxError:
    """Wrap an httpx transport failure of request ``what`` (e.g. "GET /v1/…")."""
    if isinstance(exc, httpx.TimeoutException):
        return TimeoutError(f"{what}: request timed out ({type(exc).__name__})", code="request_timeout")
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.WriteError):
        # The server may have answered and closed before reading the whole
        # body (an upload it refused); httpx cannot read that answer.
        return ConnectionError(
            f"{what}: the connection closed while sending the request body ({detail}); "
            "the server may have refused the request",
            code="write_failed",
        )
    return ConnectionError(f"{what}: {detail}", code="connection_error")
