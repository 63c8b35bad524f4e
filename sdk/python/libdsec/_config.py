"""Where the server is, how to authenticate, and how the HTTP client behaves."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import AuthenticationError, InvalidArgumentError

DEFAULT_URL = "http://127.0.0.1:7878"
# The token `dsec up` writes for the local user.
DEFAULT_TOKEN_FILE = "/var/lib/dsec/token"
DEFAULT_REQUEST_TIMEOUT = 30.0
# Added to a command's timeout to get the timeout of the request that runs it.
EXEC_TIMEOUT_MARGIN = 30.0
# The server's default command timeout (ExecRequest.timeout_s).
SERVER_COMMAND_TIMEOUT = 60.0


def resolve_url(url: str | None = None) -> str:
    """Return url, else $DSEC_URL, else the local default, without a trailing slash.

    Several API servers of one DSec may be given, comma-separated
    (``"http://a:7878,http://b:7878"``): each is checked and normalised, and
    they are returned comma-joined (see :func:`split_urls`).
    """
    url = url or os.environ.get("DSEC_URL") or DEFAULT_URL
    out = []
    for u in url.split(","):
        u = u.strip()
        if "://" not in u:
            u = "http://" + u
        if not u.startswith(("http://", "https://")) or u.rstrip("/").endswith("://"):
            raise InvalidArgumentError(f"DSec URL {u!r} must start with http:// or https:// and name a host")
        out.append(u.rstrip("/"))
    return ",".join(out)


def split_urls(url: str) -> list[str]:
    """The servers of a resolved URL (see :func:`resolve_url`)."""
    return url.split(",")


def resolve_token(token: str | None = None, token_file: str | None = None) -> str:
    """Return token, else $DSEC_TOKEN, else the token of a local `dsec up`
    (token_file, default /var/lib/dsec/token).

    Raises AuthenticationError if none is found.
    """
    token_file = token_file or DEFAULT_TOKEN_FILE
    if token:
        return token
    env = os.environ.get("DSEC_TOKEN")
    if env:
        return env.strip()
    try:
        with open(token_file, encoding="utf-8") as f:
            found = f.read().strip()
    except OSError:
        found = ""
    if found:
        return found
    raise AuthenticationError(
        "no DSec API token: pass token=..., set DSEC_TOKEN, or run on the host of "
        f"`dsec up` as a user who can read {token_file} (`dsec token` prints it)",
        code="no_token",
    )


@dataclass(frozen=True)
class ClientOptions:
    """How a Client talks to the server. Immutable; see :class:`libdsec.Client`."""

    url: str
    token: str
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    connect_timeout: float = 10.0
    max_connections: int = 100
    max_keepalive_connections: int | None = None
    keepalive_expiry: float = 15.0
    # Retries after the first attempt, for 429, 503 with Retry-After, and
    # transport errors where a retry is safe.
    max_retries: int = 10
    backoff_base: float = 0.2
    backoff_max: float = 10.0
    # A Retry-After longer than this is not waited for: the error is raised.
    retry_after_max: float = 60.0
    # No retry starts this long after a call's first attempt (None: no
    # bound but max_retries).
    retry_timeout: float | None = 120.0

    def __post_init__(self) -> None:
        if self.request_timeout <= 0:
            raise InvalidArgumentError("request_timeout must be positive")
        if self.max_connections < 1:
            raise InvalidArgumentError("max_connections must be at least 1")
        if self.max_retries < 0:
            raise InvalidArgumentError("max_retries must be >= 0")
        if self.retry_timeout is not None and self.retry_timeout < 0:
            raise InvalidArgumentError("retry_timeout must be >= 0 or None")
