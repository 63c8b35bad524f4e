"""libdsec: the Python SDK of DSec, a sandbox fabric for AI agents.

    from libdsec import Sandbox

    with Sandbox.create(tier="function") as sb:
        print(sb.commands.run(["echo", "hello"]).stdout)

E2B-shaped: ``Sandbox`` / ``AsyncSandbox`` with ``commands`` and ``files``;
``tier`` is the one parameter that switches the substrate. ``Layer`` and
``Image`` build layers (from a local directory or an archive) and compose
images from them.
"""

from ._http import AsyncClient, Client
from ._models import (
    AuditEvent,
    CommandResult,
    EntryInfo,
    GradeCase,
    GradeResult,
    GradeSummary,
    ImageInfo,
    IntegrityReport,
    LayerInfo,
    PhaseChange,
    ProcessInfo,
    RuleCount,
    SandboxInfo,
    SandboxStats,
)
from ._version import __version__
from .commands import AsyncCommandHandle, AsyncCommands, CommandHandle, Commands
from .errors import (
    AuthenticationError,
    CommandExitError,
    ConflictError,
    ConnectionError,
    InvalidArgumentError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ReadOnlyError,
    SandboxError,
    SandboxNotRunningError,
    ServerError,
    TimeoutError,
    UnsupportedError,
)
from .files import AsyncFiles, AsyncFileStream, Files, FileStream
from .images import AsyncImage, AsyncLayer, Image, Layer
from .sandbox import Sandbox
from .sandbox_async import AsyncSandbox

__all__ = [
    "__version__",
    "Sandbox",
    "AsyncSandbox",
    "Client",
    "AsyncClient",
    "SandboxInfo",
    "SandboxStats",
    "AuditEvent",
    "IntegrityReport",
    "PhaseChange",
    "RuleCount",
    "GradeSummary",
    "GradeResult",
    "GradeCase",
    "CommandResult",
    "ProcessInfo",
    "EntryInfo",
    "Image",
    "AsyncImage",
    "Layer",
    "AsyncLayer",
    "ImageInfo",
    "LayerInfo",
    "Commands",
    "AsyncCommands",
    "CommandHandle",
    "AsyncCommandHandle",
    "Files",
    "AsyncFiles",
    "FileStream",
    "AsyncFileStream",
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
]
