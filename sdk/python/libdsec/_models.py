"""Result and info types, and their parsing from the API's JSON."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, List, Mapping, TypeVar

__all__ = [
    "SandboxInfo",
    "SandboxStats",
    "AuditEvent",
    "PhaseChange",
    "RuleCount",
    "GradeSummary",
    "IntegrityReport",
    "GradeCase",
    "GradeResult",
    "CommandResult",
    "ProcessInfo",
    "EntryInfo",
    "LayerInfo",
    "ImageInfo",
    "Divergence",
    "Snapshot",
    "StepKind",
    "StepCreate",
    "StepExec",
    "StepFile",
    "StepResume",
    "TrajectoryStep",
    "Trajectory",
    "ResumeResult",
    "ForkResult",
    "Forked",
]

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
    # The trajectory the sandbox records to ("" for none); incarnation
    # counts the sandboxes that have been this one (1, plus one per
    # resume); divergence is set when a resume stopped at a step that did
    # not match the log.
    trajectory: str = ""
    incarnation: int = 0
    divergence: Divergence | None = None

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
            trajectory=str(d.get("trajectory") or ""),
            incarnation=int(d.get("incarnation") or 0),
            divergence=Divergence.maybe(d.get("divergence")),
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
    record's ``reason``). ``step`` is the trajectory step current when it
    happened (0 outside a recorded step)."""

    sandbox: str
    time: datetime | None
    kind: str
    verdict: str
    severity: str
    pid: int = 0
    uid: int = 0
    comm: str = ""
    phase: str = ""
    step: int = 0
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
            step=int(d.get("step") or 0),
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
class PhaseChange:
    """A sandbox entering a phase (the ``PhaseChange`` schema)."""

    phase: str
    at: datetime | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PhaseChange:
        return cls(phase=str(d.get("phase") or ""), at=parse_time(d.get("at")))


@dataclass
class RuleCount:
    """How often a sandbox hit an audit rule (the ``RuleCount`` schema):
    the rule's ``severity`` ("low", "medium", "high" or "critical") and
    the ``first`` hit."""

    rule: str
    severity: str
    count: int
    first: datetime | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RuleCount:
        return cls(
            rule=str(d.get("rule") or ""),
            severity=str(d.get("severity") or ""),
            count=int(d.get("count") or 0),
            first=parse_time(d.get("first")),
        )


@dataclass
class GradeSummary:
    """A sealed grading as the sandbox's record keeps it (the
    ``GradeSummary`` schema): ``discarded`` counts the agent's files the
    grading left out."""

    at: datetime | None
    tests_layer: str
    verdict: str
    tests: int = 0
    passed: int = 0
    discarded: int = 0
    reason: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GradeSummary:
        return cls(
            at=parse_time(d.get("at")),
            tests_layer=str(d.get("tests_layer") or ""),
            verdict=str(d.get("verdict") or ""),
            tests=int(d.get("tests") or 0),
            passed=int(d.get("passed") or 0),
            discarded=int(d.get("discarded") or 0),
            reason=str(d.get("reason") or ""),
        )


def _objects(value: Any) -> list[Mapping[str, Any]]:
    """The JSON objects of a list, or none if it is not one."""
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, Mapping)]


class _RawJSON:
    """Indexing into the JSON object a result was parsed from.

    grade() and integrity() returned that dict before they returned
    typed results; ``res["verdict"]`` keeps working for code written
    then. ``raw`` also holds fields a newer server sends that this SDK
    does not know yet.
    """

    raw: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]


@dataclass
class IntegrityReport(_RawJSON):
    """What a trainer needs to decide whether to trust (or zero) a
    rollout's reward (the ``IntegrityReport`` schema).

    ``phases`` the sandbox went through, in order; ``events`` counts the
    monitor's events and ``denied`` the actions a security check refused;
    ``rules`` are the audit rules hit and ``by_severity`` their hits by
    severity; ``sealed_grading`` says whether a sealed grading ran and
    ``grades`` are the gradings, oldest first; ``suspicious``: a high or
    critical rule was hit. ``monitored``: the node's monitor watched the
    sandbox (never on microvm and vm: the node's monitor does not see
    inside a guest; nothing above then comes from it). ``guest_enforced``
    names the parts of the phases the sandbox's guest applied itself
    rather than the host ("writable", "user", "capabilities",
    "processes" on the VM tiers; empty on container and function).

    ``raw`` is the JSON object as received; ``report["suspicious"]``
    indexes it.
    """

    sandbox: str
    phases: list[PhaseChange] = field(default_factory=list)
    events: int = 0
    denied: int = 0
    rules: list[RuleCount] = field(default_factory=list)
    by_severity: dict[str, int] = field(default_factory=dict)
    sealed_grading: bool = False
    grades: list[GradeSummary] = field(default_factory=list)
    suspicious: bool = False
    monitored: bool = False
    guest_enforced: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> IntegrityReport:
        sev = d.get("by_severity")
        return cls(
            sandbox=str(d.get("sandbox") or ""),
            phases=[PhaseChange.from_json(p) for p in _objects(d.get("phases"))],
            events=int(d.get("events") or 0),
            denied=int(d.get("denied") or 0),
            rules=[RuleCount.from_json(r) for r in _objects(d.get("rules"))],
            by_severity={str(k): int(v or 0) for k, v in sev.items()} if isinstance(sev, Mapping) else {},
            sealed_grading=bool(d.get("sealed_grading")),
            grades=[GradeSummary.from_json(g) for g in _objects(d.get("grades"))],
            suspicious=bool(d.get("suspicious")),
            monitored=bool(d.get("monitored")),
            guest_enforced=[str(p) for p in d.get("guest_enforced") or []],
            raw=dict(d),
        )


@dataclass
class GradeCase:
    """One test of a grading's report (the ``TestCase`` schema; named so
    that pytest does not take it for a test class): ``status`` is
    "passed", "failed", "error" or "skipped"."""

    name: str
    status: str
    time_s: float = 0.0
    classname: str = ""
    message: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GradeCase:
        return cls(
            name=str(d.get("name") or ""),
            status=str(d.get("status") or ""),
            time_s=float(d.get("time_s") or 0),
            classname=str(d.get("classname") or ""),
            message=str(d.get("message") or ""),
        )


@dataclass
class GradeResult(_RawJSON):
    """The outcome of a sealed grading (the ``GradeResult`` schema).

    ``verdict`` is "passed" (the grader exited 0; every test ran and
    passed, none skipped, at least ``expected_tests`` of them, exactly
    the tests the tests layer declares if it declares them; and, where
    the grading sandbox was ``audited``, it hit no audit rule and no
    process but the grader wrote the report), "failed", or "error" (the
    run cannot be trusted: the grader timed out, was killed, exited
    non-zero with no failing test, hit a rule, had its report written by
    another process, or wrote no usable report); ``reason`` says why
    when it is not "passed".

    ``grader`` is the sealed sandbox that ran the grader (destroyed
    since). ``declared_tests`` is how many tests the tests layer declares
    (0: none, the report's names are not checked). ``audited``: the
    grading sandbox's own audit counted toward the verdict (false where
    the node's monitor does not watch it: function and VM tiers);
    ``grader_rules`` are the rules it hit while the grader ran.
    ``tests`` … ``skipped`` count the report's tests and ``cases`` are
    they. ``exit_code``, ``timed_out`` and ``duration_ms`` are the grader
    command's (exit 0 alone never passes); ``output`` is the tail of its
    stdout and stderr. ``carried`` counts the agent's files the grading
    saw (``carried_bytes`` their size); ``discarded`` lists those it did
    not, each with why. ``integrity`` is the rollout's report when the
    grading ran.

    ``raw`` is the JSON object as received; ``res["verdict"]`` indexes
    it.
    """

    sandbox: str
    grader: str
    verdict: str
    reason: str = ""
    declared_tests: int = 0
    audited: bool = False
    grader_rules: list[RuleCount] = field(default_factory=list)
    tests: int = 0
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    cases: list[GradeCase] = field(default_factory=list)
    exit_code: int = 0
    timed_out: bool = False
    duration_ms: float = 0.0
    output: str = ""
    carried: int = 0
    carried_bytes: int = 0
    discarded: list[str] = field(default_factory=list)
    integrity: IntegrityReport = field(default_factory=lambda: IntegrityReport(sandbox=""))
    at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GradeResult:
        integ = d.get("integrity")
        return cls(
            sandbox=str(d.get("sandbox") or ""),
            grader=str(d.get("grader") or ""),
            verdict=str(d.get("verdict") or ""),
            reason=str(d.get("reason") or ""),
            declared_tests=int(d.get("declared_tests") or 0),
            audited=bool(d.get("audited")),
            grader_rules=[RuleCount.from_json(r) for r in _objects(d.get("grader_rules"))],
            tests=int(d.get("tests") or 0),
            passed=int(d.get("passed") or 0),
            failed=int(d.get("failed") or 0),
            errors=int(d.get("errors") or 0),
            skipped=int(d.get("skipped") or 0),
            cases=[GradeCase.from_json(c) for c in _objects(d.get("cases"))],
            exit_code=int(d.get("exit_code") or 0),
            timed_out=bool(d.get("timed_out")),
            duration_ms=float(d.get("duration_ms") or 0),
            output=str(d.get("output") or ""),
            carried=int(d.get("carried") or 0),
            carried_bytes=int(d.get("carried_bytes") or 0),
            discarded=[str(x) for x in d.get("discarded") or []],
            integrity=IntegrityReport.from_json(integ if isinstance(integ, Mapping) else {}),
            at=parse_time(d.get("at")),
            raw=dict(d),
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
    limit, ``pids_limited`` forks refused at the process limit. On the VM
    tiers ``host_memory_bytes`` is the resident memory of the VM's process
    on the host (what the guest touched plus the VMM's own);
    ``memory_bytes`` and ``memory_limit_bytes`` are then the guest's view,
    ``cpu_seconds`` the VM process's CPU time on the host.
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
    host_memory_bytes: int = 0

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
            host_memory_bytes=int(d.get("host_memory_bytes") or 0),
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


# ------------------------------------------------------------ trajectories


@dataclass
class Divergence(_RawJSON):
    """A replayed step whose result differed from the log (the
    ``Divergence`` schema): the ``step`` and its ``kind``, and the
    ``logged`` and ``replayed`` results as the server describes them."""

    step: int
    kind: str
    logged: str = ""
    replayed: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Divergence:
        return cls(
            step=int(d.get("step") or 0),
            kind=str(d.get("kind") or ""),
            logged=str(d.get("logged") or ""),
            replayed=str(d.get("replayed") or ""),
            raw=dict(d),
        )

    @classmethod
    def maybe(cls, value: Any) -> Divergence | None:
        """The divergence of an optional field, or None."""
        return cls.from_json(value) if isinstance(value, Mapping) else None


@dataclass
class Snapshot(_RawJSON):
    """A sandbox's writable state stored as layers (the ``Snapshot``
    schema). ``Sandbox.create(from_snapshot=snapshot.id)`` starts from
    it, and a resume starts from a trajectory's latest one. ``step`` is
    the trajectory's step it was taken at, ``layers`` the state layers
    (bottom first), ``bytes`` what this snapshot newly stored."""

    id: str
    tier: str = ""
    sandbox: str = ""
    trajectory: str = ""
    step: int = 0
    layers: list[str] = field(default_factory=list)
    bytes: int = 0
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Snapshot:
        return cls(
            id=str(d.get("id") or ""),
            tier=str(d.get("tier") or ""),
            sandbox=str(d.get("sandbox") or ""),
            trajectory=str(d.get("trajectory") or ""),
            step=int(d.get("step") or 0),
            layers=[str(x) for x in d.get("layers") or []],
            bytes=int(d.get("bytes") or 0),
            created_at=parse_time(d.get("created_at")),
            raw=dict(d),
        )


class StepKind:
    """The kinds of a trajectory step (``TrajectoryStep.kind``)."""

    CREATE = "create"  # the sandbox's resolved spec
    EXEC = "exec"  # a command and its result
    WRITE = "write"  # a file written
    MKDIR = "mkdir"
    REMOVE = "remove"
    RENAME = "rename"
    PHASE = "phase"  # a phase change
    SNAPSHOT = "snapshot"  # the writable state stored
    RESUME = "resume"  # a new incarnation rebuilt from the log
    END = "end"  # the sandbox ended


@dataclass
class StepCreate:
    """A create step (the ``StepCreate`` schema): the ``request`` as
    resolved (the image by ID), the ``secret_env`` keys whose values are
    not logged, and the snapshot it started from."""

    request: dict[str, Any] = field(default_factory=dict)
    secret_env: list[str] = field(default_factory=list)
    from_snapshot: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StepCreate:
        req = d.get("request")
        return cls(
            request=dict(req) if isinstance(req, Mapping) else {},
            secret_env=[str(k) for k in d.get("secret_env") or []],
            from_snapshot=str(d.get("from_snapshot") or ""),
        )


@dataclass
class StepExec:
    """An exec step (the ``StepExec`` schema): the ``request`` (stdin
    replaced by ``stdin_digest``) and its result. Outputs past the
    server's inline limit are blobs (``stdout_blob``, ``stderr_blob``:
    read them with ``trajectories.blob``); ``output_digest`` covers both
    streams whatever their size and is what a replay compares.
    ``process``: started in the background (``pid``), not waited for."""

    request: dict[str, Any] = field(default_factory=dict)
    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    output_digest: str = ""
    stdin_digest: str = ""
    timed_out: bool = False
    stdout_blob: str = ""
    stderr_blob: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    process: bool = False
    pid: int = 0

    @property
    def cmd(self) -> str | list[str]:
        """The command as given: argv (a list) or a command line (a str)."""
        argv = self.request.get("cmd")
        if isinstance(argv, list) and argv:
            return [str(a) for a in argv]
        return str(self.request.get("command") or "")

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StepExec:
        req = d.get("request")
        return cls(
            request=dict(req) if isinstance(req, Mapping) else {},
            exit_code=int(d.get("exit_code") or 0),
            stdout=str(d.get("stdout") or ""),
            stderr=str(d.get("stderr") or ""),
            output_digest=str(d.get("output_digest") or ""),
            stdin_digest=str(d.get("stdin_digest") or ""),
            timed_out=bool(d.get("timed_out")),
            stdout_blob=str(d.get("stdout_blob") or ""),
            stderr_blob=str(d.get("stderr_blob") or ""),
            stdout_truncated=bool(d.get("stdout_truncated")),
            stderr_truncated=bool(d.get("stderr_truncated")),
            process=bool(d.get("process")),
            pid=int(d.get("pid") or 0),
        )


@dataclass
class StepFile:
    """A file step (the ``StepFile`` schema): write, mkdir, remove or
    rename (``to``). A write's content is the blob ``digest``."""

    path: str
    to: str = ""
    digest: str = ""
    size: int = 0
    mode: str = ""
    parents: bool = False
    recursive: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StepFile:
        return cls(
            path=str(d.get("path") or ""),
            to=str(d.get("to") or ""),
            digest=str(d.get("digest") or ""),
            size=int(d.get("size") or 0),
            mode=str(d.get("mode") or ""),
            parents=bool(d.get("parents")),
            recursive=bool(d.get("recursive")),
        )


@dataclass
class StepResume:
    """A resume step (the ``StepResume`` schema): a new incarnation, why
    (``reason``: "request" or "preempted"), the snapshot it started from
    and the steps it replayed and skipped."""

    replayed: int = 0
    skipped: int = 0
    reason: str = ""
    from_snapshot: str = ""
    divergence: Divergence | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StepResume:
        return cls(
            replayed=int(d.get("replayed") or 0),
            skipped=int(d.get("skipped") or 0),
            reason=str(d.get("reason") or ""),
            from_snapshot=str(d.get("from_snapshot") or ""),
            divergence=Divergence.maybe(d.get("divergence")),
        )


def _maybe(value: Any, parse: Any) -> Any:
    return parse(value) if isinstance(value, Mapping) else None


@dataclass
class TrajectoryStep(_RawJSON):
    """One logged interaction (the ``TrajectoryStep`` schema), numbered
    from 1. ``kind`` (a :class:`StepKind`) says which of ``create``,
    ``exec``, ``file`` (write, mkdir, remove, rename), ``phase`` (the
    phase moved to), ``snapshot``, ``resume`` and ``end_reason`` is set.
    ``pure``: the step changed nothing a later step could see, and a
    replay skips it. ``audit`` are the audit events the sandbox raised
    during the step; ``sandbox`` is the incarnation that ran it."""

    trajectory: str
    step: int
    kind: str
    at: datetime | None = None
    sandbox: str = ""
    duration_ms: float = 0.0
    pure: bool = False
    create: StepCreate | None = None
    exec: StepExec | None = None
    file: StepFile | None = None
    phase: str = ""
    snapshot: Snapshot | None = None
    resume: StepResume | None = None
    end_reason: str = ""
    audit: list[AuditEvent] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TrajectoryStep:
        phase = d.get("phase")
        end = d.get("end")
        return cls(
            trajectory=str(d.get("trajectory") or ""),
            step=int(d.get("step") or 0),
            kind=str(d.get("kind") or ""),
            at=parse_time(d.get("at")),
            sandbox=str(d.get("sandbox") or ""),
            duration_ms=float(d.get("duration_ms") or 0),
            pure=bool(d.get("pure")),
            create=_maybe(d.get("create"), StepCreate.from_json),
            exec=_maybe(d.get("exec"), StepExec.from_json),
            file=_maybe(d.get("file"), StepFile.from_json),
            phase=str(phase.get("phase") or "") if isinstance(phase, Mapping) else "",
            snapshot=_maybe(d.get("snapshot"), Snapshot.from_json),
            resume=_maybe(d.get("resume"), StepResume.from_json),
            end_reason=str(end.get("reason") or "") if isinstance(end, Mapping) else "",
            audit=[AuditEvent.from_json(e) for e in _objects(d.get("audit"))],
            labels=_str_map(d.get("labels")),
            raw=dict(d),
        )


@dataclass
class Trajectory(_RawJSON):
    """A trajectory's head (the ``Trajectory`` schema): the durable log of
    a rollout. ``state`` is "recording", "resuming", "diverged" or
    "ended"; ``sandbox`` records to it now (or did last); ``steps`` is the
    last step's number and ``bytes`` what the log and its blobs hold;
    ``snapshots`` are the states stored along the way, oldest first;
    ``incarnations`` counts the sandboxes that recorded it (1, plus one
    per resume). A forked trajectory names its ``parent`` and the
    ``parent_step`` it starts after."""

    id: str
    state: str
    sandbox: str = ""
    tier: str = ""
    parent: str = ""
    parent_step: int = 0
    steps: int = 0
    bytes: int = 0
    snapshots: list[Snapshot] = field(default_factory=list)
    incarnations: int = 0
    divergence: Divergence | None = None
    resume_on_preempt: bool = False
    created_at: datetime | None = None
    updated_at: datetime | None = None
    expires_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Trajectory:
        return cls(
            id=str(d.get("id") or ""),
            state=str(d.get("state") or ""),
            sandbox=str(d.get("sandbox") or ""),
            tier=str(d.get("tier") or ""),
            parent=str(d.get("parent") or ""),
            parent_step=int(d.get("parent_step") or 0),
            steps=int(d.get("steps") or 0),
            bytes=int(d.get("bytes") or 0),
            snapshots=[Snapshot.from_json(x) for x in _objects(d.get("snapshots"))],
            incarnations=int(d.get("incarnations") or 0),
            divergence=Divergence.maybe(d.get("divergence")),
            resume_on_preempt=bool(d.get("resume_on_preempt")),
            created_at=parse_time(d.get("created_at")),
            updated_at=parse_time(d.get("updated_at")),
            expires_at=parse_time(d.get("expires_at")),
            raw=dict(d),
        )


@dataclass
class ResumeResult(_RawJSON):
    """What a resume did (the ``ResumeResult`` schema): the new
    ``sandbox``, the steps ``replayed`` and ``skipped`` (pure ones), the
    snapshot it started from, and the ``divergence`` if a replayed step
    did not match the log."""

    sandbox: SandboxInfo
    replayed: int = 0
    skipped: int = 0
    from_snapshot: str = ""
    duration_ms: float = 0.0
    divergence: Divergence | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ResumeResult:
        sb = d.get("sandbox")
        return cls(
            sandbox=SandboxInfo.from_json(sb if isinstance(sb, Mapping) else {}),
            replayed=int(d.get("replayed") or 0),
            skipped=int(d.get("skipped") or 0),
            from_snapshot=str(d.get("from_snapshot") or ""),
            duration_ms=float(d.get("duration_ms") or 0),
            divergence=Divergence.maybe(d.get("divergence")),
            raw=dict(d),
        )


@dataclass
class ForkResult(_RawJSON):
    """A fork (the ``ForkResult`` schema): the children, in order, and the
    snapshot they started from."""

    snapshot: Snapshot
    sandboxes: list[SandboxInfo] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ForkResult:
        snap = d.get("snapshot")
        return cls(
            snapshot=Snapshot.from_json(snap if isinstance(snap, Mapping) else {}),
            sandboxes=[SandboxInfo.from_json(x) for x in _objects(d.get("sandboxes"))],
            raw=dict(d),
        )


_S = TypeVar("_S")


class Forked(List[_S]):
    """The sandboxes a fork started, in order (a list), with the
    ``snapshot`` they started from and the whole :class:`ForkResult`
    (``result``)."""

    def __init__(self, sandboxes: Iterable[_S], result: ForkResult) -> None:
        super().__init__(sandboxes)
        self.result = result

    @property
    def snapshot(self) -> Snapshot:
        return self.result.snapshot


@dataclass
class NodeInfo:
    """A node as the control plane sees it (the ``Node`` schema).

    ``tiers`` are the tiers it runs now; ``capacity`` and ``usage`` are the
    heartbeat's figures as sent. ``cordoned``: no new sandbox is placed on
    it; ``draining``: cordoned, and its sandboxes move off or end by
    ``drain_deadline``.
    """

    id: str
    version: str = ""
    ready: bool = False
    tiers: list[str] = field(default_factory=list)
    capacity: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    last_seen: datetime | None = None
    started_at: datetime | None = None
    cordoned: bool = False
    draining: bool = False
    drain_deadline: datetime | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeInfo:
        return cls(
            id=str(d.get("id", "")),
            version=str(d.get("version") or ""),
            ready=bool(d.get("ready")),
            tiers=[str(t.get("name", "")) for t in d.get("tiers") or [] if t.get("available")],
            capacity=dict(d.get("capacity") or {}),
            usage=dict(d.get("usage") or {}),
            last_seen=parse_time(d.get("last_seen")),
            started_at=parse_time(d.get("started_at")),
            cordoned=bool(d.get("cordoned")),
            draining=bool(d.get("draining")),
            drain_deadline=parse_time(d.get("drain_deadline")),
        )
