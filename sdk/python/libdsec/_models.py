"""Result and info types, and their parsing from the API's JSON."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

__all__ = ["SandboxInfo", "SandboxStats", "CommandResult", "ProcessInfo", "EntryInfo", "LayerInfo", "ImageInfo"]

_FRACTION = re.compile(r"(\.\d{6})\d+")


def parse_time(value: Any) -> datetime | None:
    """Parse an RFC 3339 timestamp as Go writes it (nanoseconds, "Z")."""
    if not isinstance(value, str) or not value:
        return None
    # fromisoformat takes at most microseconds.
    value = _FRACTION.sub(r"\1", value)
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    # Go's zero time means "unset".
    return None if t.year <= 1 else t


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


@dataclass
class SandboxInfo:
    """A sandbox, as the API describes it (the ``Sandbox`` schema).

    ``labels`` are what E2B calls metadata; ``metadata`` is an alias.
    """

    id: str
    tier: str
    image: str
    state: str
    created_at: datetime | None
    expires_at: datetime | None
    image_id: str = ""
    node: str = ""
    cpu: float = 0.0
    memory_mb: int = 0
    disk_mb: int = 0
    timeout_s: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    ended_at: datetime | None = None
    reason: str = ""
    # The network policy as the API reports it ({"egress": ..., "allow":
    # [...]}), or None for the default (no egress).
    network: dict[str, Any] | None = None
    # The task's phases as the API reports them, and the current one ("" for
    # a sandbox created without phases).
    phases: list[dict[str, Any]] = field(default_factory=list)
    phase: str = ""
    # The Linux capabilities asked for at create (container tier).
    capabilities: list[str] = field(default_factory=list)

    @property
    def sandbox_id(self) -> str:
        return self.id

    @property
    def metadata(self) -> dict[str, str]:
        return self.labels

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SandboxInfo:
        return cls(
            id=str(d.get("id", "")),
            tier=str(d.get("tier", "")),
            image=str(d.get("image", "")),
            state=str(d.get("state", "")),
            created_at=parse_time(d.get("created_at")),
            expires_at=parse_time(d.get("expires_at")),
            image_id=str(d.get("image_id") or ""),
            node=str(d.get("node") or ""),
            cpu=float(d.get("cpu") or 0),
            memory_mb=int(d.get("memory_mb") or 0),
            disk_mb=int(d.get("disk_mb") or 0),
            timeout_s=int(d.get("timeout_s") or 0),
            labels=_str_map(d.get("labels")),
            ended_at=parse_time(d.get("ended_at")),
            reason=str(d.get("reason") or ""),
            network=dict(d["network"]) if isinstance(d.get("network"), Mapping) else None,
            phases=[dict(p) for p in d.get("phases") or [] if isinstance(p, Mapping)],
            phase=str(d.get("phase") or ""),
            capabilities=[str(c) for c in d.get("capabilities") or []],
        )


@dataclass
class AuditEvent:
    """One thing a process in a sandbox did that the node's eBPF monitor saw
    (the ``AuditEvent`` schema): an exec (``kind`` "exec", ``path`` the
    program) or a watched system call (``kind`` "syscall") with its
    ``result`` and ``verdict`` ("allowed", "denied" or "failed"), and the
    ``rule`` it hit with its ``severity`` ("info" when none). A call's
    ``path`` is absolute in the sandbox; ``target`` is a rename's or
    link's new name. Events the node reports itself carry a ``detail``: a
    ``sandbox-ended`` event's says how the sandbox ended (its failed
    record's ``reason``)."""

    sandbox: str
    time: datetime | None
    kind: str
    verdict: str
    severity: str
    pid: int = 0
    uid: int = 0
    comm: str = ""
    phase: str = ""
    syscall: str = ""
    path: str = ""
    target: str = ""
    addr: str = ""
    argv: list[str] = field(default_factory=list)
    result: int = 0
    rule: str = ""
    description: str = ""
    detail: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AuditEvent:
        return cls(
            sandbox=str(d.get("sandbox") or ""),
            time=parse_time(d.get("time")),
            kind=str(d.get("kind") or ""),
            verdict=str(d.get("verdict") or ""),
            severity=str(d.get("severity") or ""),
            pid=int(d.get("pid") or 0),
            uid=int(d.get("uid") or 0),
            comm=str(d.get("comm") or ""),
            phase=str(d.get("phase") or ""),
            syscall=str(d.get("syscall") or ""),
            path=str(d.get("path") or ""),
            target=str(d.get("target") or ""),
            addr=str(d.get("addr") or ""),
            argv=[str(a) for a in d.get("argv") or []],
            result=int(d.get("result") or 0),
            rule=str(d.get("rule") or ""),
            description=str(d.get("description") or ""),
            detail=str(d.get("detail") or ""),
        )


@dataclass
class SandboxStats:
    """A running sandbox's resource use (the ``SandboxStats`` schema), as its
    node measures it from outside the sandbox, and the limits it hit.

    Sizes are bytes. A limit of 0 means the tier does not report it;
    ``memory_peak_bytes`` is 0 where the tier keeps no peak. ``processes``
    counts tasks (processes and threads; on the function tier, the calls
    running now). ``disk_bytes`` is what was written to the sandbox's
    writable layer. ``oom_kills`` counts processes killed at the memory
    limit, ``pids_limited`` forks refused at the process limit.
    """

    memory_bytes: int
    cpu_seconds: float
    processes: int
    disk_bytes: int
    memory_peak_bytes: int = 0
    memory_limit_bytes: int = 0
    disk_limit_bytes: int = 0
    disk_full: bool = False
    oom_kills: int = 0
    pids_limited: int = 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SandboxStats:
        # The optional fields are omitted when zero (Go's omitempty).
        return cls(
            memory_bytes=int(d.get("memory_bytes") or 0),
            cpu_seconds=float(d.get("cpu_seconds") or 0),
            processes=int(d.get("processes") or 0),
            disk_bytes=int(d.get("disk_bytes") or 0),
            memory_peak_bytes=int(d.get("memory_peak_bytes") or 0),
            memory_limit_bytes=int(d.get("memory_limit_bytes") or 0),
            disk_limit_bytes=int(d.get("disk_limit_bytes") or 0),
            disk_full=bool(d.get("disk_full")),
            oom_kills=int(d.get("oom_kills") or 0),
            pids_limited=int(d.get("pids_limited") or 0),
        )


@dataclass
class CommandResult:
    """The outcome of a command (the ``ExecResult`` schema).

    ``exit_code`` is -1 when the command had no exit status (it timed out,
    was killed or trapped); ``error`` then says which.
    """

    stdout: str
    stderr: str
    exit_code: int
    error: str = ""
    duration_ms: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    # The sandbox's phase the command ran in ("" without phases).
    phase: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CommandResult:
        return cls(
            stdout=str(d.get("stdout") or ""),
            stderr=str(d.get("stderr") or ""),
            exit_code=int(d.get("exit_code", -1)),
            error=str(d.get("error") or ""),
            duration_ms=float(d.get("duration_ms") or 0),
            stdout_truncated=bool(d.get("stdout_truncated")),
            stderr_truncated=bool(d.get("stderr_truncated")),
            timed_out=bool(d.get("timed_out")),
            phase=str(d.get("phase") or ""),
        )


@dataclass
class ProcessInfo:
    """A background process (the ``Process`` schema)."""

    pid: int
    cmd: list[str]
    state: str
    exit_code: int | None = None
    started_at: datetime | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProcessInfo:
        code = d.get("exit_code")
        return cls(
            pid=int(d.get("pid", 0)),
            cmd=[str(a) for a in d.get("cmd") or []],
            state=str(d.get("state", "")),
            exit_code=None if code is None else int(code),
            started_at=parse_time(d.get("started_at")),
        )


@dataclass
class EntryInfo:
    """A file or directory in a sandbox (the ``FileInfo`` schema).

    ``type`` is "file", "dir", "symlink" or "other"; ``path`` is absolute
    within the sandbox; ``mode`` holds the permission bits.
    """

    name: str
    path: str
    type: str
    size: int = 0
    mode: int = 0
    mtime: datetime | None = None
    target: str = ""

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EntryInfo:
        return cls(
            name=str(d.get("name", "")),
            path=str(d.get("path", "")),
            type=str(d.get("type", "")),
            size=int(d.get("size") or 0),
            mode=int(d.get("mode") or 0),
            mtime=parse_time(d.get("mtime")),
            target=str(d.get("target") or ""),
        )


@dataclass
class LayerInfo:
    """A layer (the ``Layer`` schema): an EROFS metadata image and data blob.

    ``names`` are the name:version references that point at it;
    ``source_kind`` is "dir", "tar", "oci" or "docker" and ``source_digest``
    the digest of what it was built from.
    """

    id: str
    names: list[str] = field(default_factory=list)
    meta_size: int = 0
    blob_size: int = 0
    source_kind: str = ""
    source_digest: str = ""
    builder: str = ""
    created_at: datetime | None = None

    @property
    def name(self) -> str:
        """The first name, or the ID of an unnamed layer: a reference to it."""
        return self.names[0] if self.names else self.id

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LayerInfo:
        return cls(
            id=str(d.get("id", "")),
            names=[str(n) for n in d.get("names") or []],
            meta_size=int(d.get("meta_size") or 0),
            blob_size=int(d.get("blob_size") or 0),
            source_kind=str(d.get("source_kind") or ""),
            source_digest=str(d.get("source_digest") or ""),
            builder=str(d.get("builder") or ""),
            created_at=parse_time(d.get("created_at")),
        )


@dataclass
class ImageInfo:
    """An image (the ``Image`` schema).

    ``layers`` are (role, layer ID) pairs, bottom first; ``name`` is the
    name:tag it was listed or resolved under; ``source`` is "layers", or
    "dir:<path>" for a directory image; empty ``tiers`` means any tier.
    """

    id: str
    name: str = ""
    layers: list[tuple[str, str]] = field(default_factory=list)
    tiers: list[str] = field(default_factory=list)
    source: str = ""
    created_at: datetime | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ImageInfo:
        layers = []
        for item in d.get("layers") or []:
            if isinstance(item, Mapping):
                layers.append((str(item.get("role", "")), str(item.get("id", ""))))
        return cls(
            id=str(d.get("id", "")),
            name=str(d.get("name") or ""),
            layers=layers,
            tiers=[str(t) for t in d.get("tiers") or []],
            source=str(d.get("source") or ""),
            created_at=parse_time(d.get("created_at")),
        )
