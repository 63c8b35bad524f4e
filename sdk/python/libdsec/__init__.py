"""libdsec: the Python SDK of DSec, a sandbox fabric for AI agents.

    from libdsec import Sandbox

    with Sandbox.create(tier="function") as sb:
        print(sb.commands.run(["echo", "hello"]).stdout)

E2B-shaped: ``Sandbox`` / ``AsyncSandbox`` with ``commands`` and ``files``;
``tier`` is the one parameter that switches the substrate. ``Layer`` and
``Image`` build layers (from a local directory or an archive) and compose
images from them. ``trajectory=`` records a rollout; ``Sandbox.resume``,
``sb.snapshot()`` and ``sb.fork()`` start sandboxes from a recorded or
stored state, and ``client.trajectories`` reads the logs.
"""

from ._http import AsyncClient, Client
from ._models import (
    AuditEvent,
    CommandResult,
    Divergence,
    EntryInfo,
    Forked,
    ForkResult,
    GradeCase,
    GradeResult,
    GradeSummary,
    ImageInfo,
    IntegrityReport,
    LayerInfo,
    NodeInfo,
    PhaseChange,
    ProcessInfo,
    ResumeResult,
    RuleCount,
    SandboxInfo,
    SandboxStats,
    Snapshot,
    StepCreate,
    StepExec,
    StepFile,
    StepKind,
    StepResume,
    Trajectory,
    TrajectoryStep,
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
    ReplayDivergedError,
    SandboxError,
    SandboxNotRunningError,
    ServerError,
    TimeoutError,
    TrajectoryInFlightError,
    UnsupportedError,
)
from .files import AsyncFiles, AsyncFileStream, Files, FileStream
from .images import AsyncImage, AsyncLayer, Image, Layer
from .nodes import AsyncNode, Node
from .sandbox import Sandbox
from .sandbox_async import AsyncSandbox
from .trajectories import AsyncSnapshots, AsyncTrajectories, Snapshots, Trajectories

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
    "Trajectory",
    "TrajectoryStep",
    "StepKind",
    "StepCreate",
    "StepExec",
    "StepFile",
    "StepResume",
    "Snapshot",
    "Divergence",
    "ResumeResult",
    "ForkResult",
    "Forked",
    "Trajectories",
    "AsyncTrajectories",
    "Snapshots",
    "AsyncSnapshots",
    "CommandResult",
    "ProcessInfo",
    "EntryInfo",
    "Node",
    "AsyncNode",
    "NodeInfo",
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
    "ReplayDivergedError",
    "TrajectoryInFlightError",
    "CommandExitError",
    "TimeoutError",
    "ServerError",
    "ConnectionError",
]
