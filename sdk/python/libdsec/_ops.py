"""The API's operations, written once for the sync and the async client.

Each operation is a generator: it yields the Calls it needs, receives each
successful httpx.Response (or has the mapped SandboxError thrown in at the
yield), and returns the parsed result. Client.run and AsyncClient.run drive
them, so request building, response parsing and error handling cannot drift
between Sandbox and AsyncSandbox.
"""

from __future__ import annotations

import json
from typing import Any, Generator, Iterable, Mapping, Sequence, TypeVar, Union
from urllib.parse import quote

import httpx

from ._calls import Body, BodyData, Call
from ._config import SERVER_COMMAND_TIMEOUT
from ._models import (
    NodeInfo,
    AuditEvent,
    CommandResult,
    EntryInfo,
    ForkResult,
    GradeResult,
    ImageInfo,
    IntegrityReport,
    LayerInfo,
    ProcessInfo,
    ResumeResult,
    SandboxInfo,
    SandboxStats,
    Snapshot,
    Trajectory,
    TrajectoryStep,
)
from .errors import (
    CommandExitError,
    ConflictError,
    ConnectionError,
    InvalidArgumentError,
    NotFoundError,
    SandboxError,
    SandboxNotRunningError,
    TimeoutError,
    error_from_body,
)

T = TypeVar("T")
Op = Generator[Call, httpx.Response, T]

# Layers of an image: {role: ref} (base, workspace and toolkit first, in
# that order, then the others as given) or (role, ref) pairs, bottom first.
LayersSpec = Union[Mapping[str, str], Sequence[tuple[str, str]]]

# Secret env of a create: keys of envs whose values are never logged, or a
# mapping of secret values, merged into envs.
SecretEnvSpec = Union[Mapping[str, str], Iterable[str]]

# A sandbox's network policy: an egress mode ("none", "allowlist", "open")
# or the API's NetworkPolicy as a mapping, {"egress": ..., "allow": [{"cidr"
# or "host": ..., "proto": "tcp" | "udp", "ports": "443" | "8000-8100"}]}.
NetworkSpec = Union[str, Mapping[str, Any]]

_RULE_KEYS = ("cidr", "host", "proto", "ports")

# A wait for a background process with no deadline is a series of waits of
# this many seconds.
WAIT_SLICE = 60.0
_ENDED = ("stopping", "stopped", "failed")


# ---------------------------------------------------------------- helpers


def sandbox_path(sandbox_id: str, *rest: str) -> str:
    if not isinstance(sandbox_id, str) or not sandbox_id:
        raise InvalidArgumentError("sandbox_id must be a non-empty string")
    return "/".join(["/v1/sandboxes", quote(sandbox_id, safe="")] + list(rest))


def json_body(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        raise SandboxError(
            f"the server sent a response that is not JSON: {resp.text[:200]!r}",
            code="invalid_response",
            status=resp.status_code,
        ) from None


def str_map(value: Mapping[str, Any] | None, what: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{what} must be a mapping of strings to strings")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidArgumentError(f"{what} must map strings to strings; got {k!r}: {v!r}")
        out[k] = v
    return out


def _positive(value: float | None, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise InvalidArgumentError(f"{what} must be a positive number of seconds, not {value!r}")
    return value


def _text(data: str | bytes, what: str) -> str:
    if isinstance(data, str):
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgumentError(f"{what} must be UTF-8 text (the API carries it as a JSON string)") from None
    raise InvalidArgumentError(f"{what} must be str or bytes, not {type(data).__name__}")


def _bool(v: bool) -> str:
    return "true" if v else "false"


def _sandbox_gone(e: SandboxError) -> bool:
    """Whether e says the sandbox itself (not a file or process in it) is gone."""
    return e.code in ("sandbox_not_found", "sandbox_not_running")


# -------------------------------------------------------------- sandboxes


def create_body(
    *,
    tier: str | None,
    image: str | None,
    timeout: int | None,
    cpu: float | None,
    memory_mb: int | None,
    disk_mb: int | None,
    envs: Mapping[str, str] | None,
    metadata: Mapping[str, str] | None,
    labels: Mapping[str, str] | None,
    layers: LayersSpec | None = None,
    network: NetworkSpec | None = None,
    phases: Iterable[Mapping[str, Any]] | None = None,
    capabilities: Iterable[str] | None = None,
    trajectory: str | None = None,
    record: bool = False,
    secret_env: SecretEnvSpec | None = None,
    resume_on_preempt: bool = False,
    from_snapshot: str | None = None,
    request_id: str | None = None,
) -> dict[str, Any]:
    """The CreateSandboxRequest for Sandbox.create's arguments."""
    body: dict[str, Any] = {}
    if tier:
        body["tier"] = tier
    if image:
        body["image"] = image
    if layers is not None:
        if image:
            raise InvalidArgumentError("pass image or layers, not both")
        body["layers"] = layer_list(layers)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 1:
            raise InvalidArgumentError(f"timeout must be at least 1 second, not {timeout!r}")
        body["timeout_s"] = int(timeout)
    if cpu is not None:
        body["cpu"] = float(cpu)
    if memory_mb is not None:
        body["memory_mb"] = int(memory_mb)
    if disk_mb is not None:
        body["disk_mb"] = int(disk_mb)
    env = str_map(envs, "envs") or {}
    if secret_env is not None:
        env, body["secret_env"] = merge_secret_env(env, secret_env)
    if env:
        body["env"] = env
    if trajectory is not None:
        body["trajectory"] = trajectory_id(trajectory)
    if record:
        body["record"] = True
    if resume_on_preempt:
        body["resume_on_preempt"] = True
    if from_snapshot is not None:
        if not isinstance(from_snapshot, str) or not from_snapshot:
            raise InvalidArgumentError(f"from_snapshot must be a snapshot's ID, not {from_snapshot!r}")
        if image or layers is not None:
            raise InvalidArgumentError("pass from_snapshot or image/layers, not both")
        body["from_snapshot"] = from_snapshot
    if request_id is not None:
        if not isinstance(request_id, str) or not request_id:
            raise InvalidArgumentError(f"request_id must be a non-empty string, not {request_id!r}")
        body["request_id"] = request_id
    merged = {**(str_map(labels, "labels") or {}), **(str_map(metadata, "metadata") or {})}
    if merged:
        body["labels"] = merged
    if network is not None:
        body["network"] = network_policy(network)
    if phases is not None:
        body["phases"] = phase_list(phases)
    if capabilities is not None:
        body["capabilities"] = str_list(capabilities, "capabilities")
    return body


def merge_secret_env(env: dict[str, str], secret: SecretEnvSpec) -> tuple[dict[str, str], list[str]]:
    """env with the secret values merged in, and the secret keys.

    ``secret`` is a mapping of values (merged into env, over it), or keys
    that env must hold."""
    if isinstance(secret, Mapping):
        values = str_map(secret, "secret_env") or {}
        return {**env, **values}, list(values)
    keys = str_list(secret, "secret_env")
    missing = [k for k in keys if k not in env]
    if missing:
        raise InvalidArgumentError(f"secret_env names {missing}, which envs lacks; pass their values as secret_env={{key: value}}")
    return env, keys


def str_list(v: Any, what: str) -> list[str]:
    """A list of strings (not a lone string) for ``what``."""
    if isinstance(v, (str, bytes)) or not isinstance(v, Iterable) or not all(isinstance(x, str) for x in v):
        raise InvalidArgumentError(f"{what} must be a list of strings, not {v!r}")
    return list(v)


_PHASE_KEYS = ("name", "network", "writable", "user", "cpu", "memory_mb", "capabilities", "executables")


def phase_list(phases: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The API's phases for Sandbox.create's ``phases``: mappings with
    ``name`` and optionally ``network`` (as for ``network=``), ``writable``
    (absolute paths; omitted: all writable, ``[]``: none), ``user`` ("root",
    "1000" or "1000:1000"), ``cpu``, ``memory_mb``, ``capabilities`` (names
    such as "net_bind_service"; default none) and ``executables`` (absolute
    paths or "dir/*": the only programs that may run; omitted: any). The
    server checks the values (InvalidArgumentError, codes ``invalid_phase``,
    ``invalid_capability``, ``invalid_executable``…)."""
    if isinstance(phases, (str, bytes, Mapping)) or not isinstance(phases, Iterable):
        raise InvalidArgumentError("phases must be a list of mappings")
    out: list[dict[str, Any]] = []
    for p in phases:
        if not isinstance(p, Mapping) or not isinstance(p.get("name"), str):
            raise InvalidArgumentError(f"a phase must be a mapping with a name, not {p!r}")
        bad = set(p) - set(_PHASE_KEYS)
        if bad:
            raise InvalidArgumentError(f"phase {p['name']!r} has unknown keys {sorted(map(str, bad))}; it takes {', '.join(_PHASE_KEYS)}")
        d: dict[str, Any] = {"name": p["name"]}
        if p.get("network") is not None:
            d["network"] = network_policy(p["network"])
        if "writable" in p and p["writable"] is not None:
            w = p["writable"]
            if isinstance(w, (str, bytes)) or not isinstance(w, Iterable):
                raise InvalidArgumentError(f"phase {p['name']!r}: writable must be a list of paths")
            d["writable"] = [str(x) for x in w]
        for k in ("user", "cpu", "memory_mb"):
            if p.get(k) is not None:
                d[k] = p[k]
        for k in ("capabilities", "executables"):
            if p.get(k) is not None:
                d[k] = str_list(p[k], f"phase {p['name']!r}: {k}")
        out.append(d)
    return out


def set_phase(sandbox_id: str, phase: str, back: bool, timeout: float) -> Op[SandboxInfo]:
    if not isinstance(phase, str) or not phase:
        raise InvalidArgumentError(f"phase must be a phase's name, not {phase!r}")
    body: dict[str, Any] = {"phase": phase}
    if back:
        body["back"] = True
    resp = yield Call("POST", sandbox_path(sandbox_id, "phase"), timeout, json=body)
    return SandboxInfo.from_json(json_body(resp))


def network_policy(network: NetworkSpec) -> dict[str, Any]:
    """The API's NetworkPolicy for Sandbox.create's ``network``.

    Only the shape is checked here; the server checks the values (and
    answers InvalidArgumentError, code ``invalid_network_policy``).
    """
    if isinstance(network, str):
        return {"egress": network}
    if not isinstance(network, Mapping):
        raise InvalidArgumentError(
            f"network must be an egress mode (\"none\", \"allowlist\", \"open\") or a mapping, not {network!r}"
        )
    unknown = set(network) - {"egress", "allow"}
    if unknown:
        raise InvalidArgumentError(f"network has unknown keys {sorted(map(str, unknown))}; it takes egress and allow")
    out: dict[str, Any] = {}
    egress = network.get("egress")
    if egress is not None:
        if not isinstance(egress, str):
            raise InvalidArgumentError(f"network egress must be a string, not {egress!r}")
        out["egress"] = egress
    allow = network.get("allow")
    if allow is not None:
        if isinstance(allow, (str, bytes, Mapping)) or not isinstance(allow, Iterable):
            raise InvalidArgumentError("network allow must be a list of rules")
        rules: list[dict[str, str]] = []
        for rule in allow:
            if not isinstance(rule, Mapping):
                raise InvalidArgumentError(f"a network allow rule must be a mapping, not {rule!r}")
            bad = set(rule) - set(_RULE_KEYS)
            if bad:
                raise InvalidArgumentError(f"network allow rule has unknown keys {sorted(map(str, bad))}; it takes {', '.join(_RULE_KEYS)}")
            r: dict[str, str] = {}
            for k, v in rule.items():
                if k == "ports" and isinstance(v, int) and not isinstance(v, bool):
                    v = str(v)
                if not isinstance(v, str):
                    raise InvalidArgumentError(f"network allow rule {k} must be a string, not {v!r}")
                r[k] = v
            rules.append(r)
        out["allow"] = rules
    return out


def create_sandbox(body: dict[str, Any], timeout: float) -> Op[SandboxInfo]:
    resp = yield Call("POST", "/v1/sandboxes", timeout, json=body)
    return SandboxInfo.from_json(json_body(resp))


def get_sandbox(sandbox_id: str, timeout: float) -> Op[SandboxInfo]:
    resp = yield Call("GET", sandbox_path(sandbox_id), timeout)
    return SandboxInfo.from_json(json_body(resp))


def connect_sandbox(sandbox_id: str, timeout: float) -> Op[SandboxInfo]:
    """Get a sandbox, refusing one that has ended (E2B's connect does too)."""
    info = yield from get_sandbox(sandbox_id, timeout)
    if info.state in _ENDED:
        why = f" ({info.reason})" if info.reason else ""
        raise SandboxNotRunningError(f"sandbox {sandbox_id} is {info.state}{why}", code="sandbox_not_running")
    return info


def is_running(sandbox_id: str, timeout: float) -> Op[bool]:
    try:
        info = yield from get_sandbox(sandbox_id, timeout)
    except NotFoundError:
        return False
    return info.state == "running"


def list_params(
    *,
    metadata: Mapping[str, str] | None,
    state: str | None,
    tier: str | None,
    limit: int | None,
    page_token: str | None,
    labels: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """The query of GET /v1/sandboxes; labels is an alias of metadata."""
    params: list[tuple[str, str]] = []
    merged = {**(str_map(labels, "labels") or {}), **(str_map(metadata, "metadata") or {})}
    for k, v in sorted(merged.items()):
        params.append(("label", f"{k}={v}"))
    if state:
        params.append(("state", state))
    if tier:
        params.append(("tier", tier))
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidArgumentError(f"limit must be an integer from 1 to 1000, not {limit!r}")
        params.append(("limit", str(limit)))
    if page_token:
        params.append(("page_token", page_token))
    return params


def list_sandboxes_page(params: list[tuple[str, str]], timeout: float) -> Op[tuple[list[SandboxInfo], str | None]]:
    resp = yield Call("GET", "/v1/sandboxes", timeout, params=params)
    d = json_body(resp)
    items = [SandboxInfo.from_json(s) for s in d.get("sandboxes") or []]
    return items, d.get("next_page_token") or None


def list_sandboxes(params: list[tuple[str, str]], timeout: float) -> Op[list[SandboxInfo]]:
    """Every page of a listing, following next_page_token to the end."""
    out: list[SandboxInfo] = []
    seen: set[str] = set()
    token: str | None = None
    while True:
        page_params = params + ([("page_token", token)] if token else [])
        items, token = yield from list_sandboxes_page(page_params, timeout)
        out.extend(items)
        if not token:
            return out
        if token in seen:
            raise SandboxError(f"the server repeated page token {token!r}", code="invalid_response")
        seen.add(token)


def kill_sandbox(sandbox_id: str, timeout: float) -> Op[bool]:
    """Destroy a sandbox: True if it was destroyed, False if it did not exist."""
    try:
        yield Call("DELETE", sandbox_path(sandbox_id), timeout)
    except NotFoundError:
        return False
    return True


# EVENTS_PAGE is how many audit events one request asks for (the server's
# default page; it allows up to 10,000).
EVENTS_PAGE = 1000


def audit_events(sandbox_id: str, skip: int, limit: int | None, timeout: float) -> Op[list[AuditEvent]]:
    """The events after ``skip``, all of them (limit None) or at most
    ``limit``, in pages of EVENTS_PAGE: a page shorter than asked for is
    the last."""
    skip, want = int(skip), None if limit is None else int(limit)
    if skip < 0 or (want is not None and want < 0):
        raise InvalidArgumentError("skip and limit must be ≥ 0")
    out: list[AuditEvent] = []
    while want is None or len(out) < want:
        n = EVENTS_PAGE if want is None else min(EVENTS_PAGE, want - len(out))
        params = [("skip", str(skip + len(out))), ("limit", str(n))]
        resp = yield Call("GET", sandbox_path(sandbox_id, "events"), timeout, params=params)
        page = [AuditEvent.from_json(e) for e in json_body(resp).get("events") or []]
        out.extend(page[:n])
        if len(page) < n:
            break
    return out


# FOLLOW_TIMEOUT bounds the wait for the next audit event of a followed
# sandbox: the stream stays open as long as the sandbox lives.
FOLLOW_TIMEOUT = 24 * 3600.0


def follow_events_call(sandbox_id: str, skip: int) -> Call:
    """GET …/events/stream: NDJSON AuditEvents as they happen."""
    params = [("skip", str(int(skip)))] if skip else []
    return Call(
        "GET", sandbox_path(sandbox_id, "events", "stream"), FOLLOW_TIMEOUT,
        params=params, headers={"Accept": "application/x-ndjson"},
    )


def audit_event_line(line: str) -> AuditEvent | None:
    """One line of the events stream as an AuditEvent (None if blank)."""
    line = line.strip()
    return AuditEvent.from_json(json.loads(line)) if line else None


def integrity(sandbox_id: str, timeout: float) -> Op[IntegrityReport]:
    resp = yield Call("GET", sandbox_path(sandbox_id, "integrity"), timeout)
    return IntegrityReport.from_json(json_body(resp))


def grade(
    sandbox_id: str,
    tests_layer: str,
    command: str | Iterable[str],
    *,
    report: str | None = None,
    reporter: str | None = None,
    expected_tests: int | None = None,
    carry: Sequence[str] | None = None,
    sealed: Sequence[str] | None = None,
    protected: Sequence[str] | None = None,
    envs: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout_s: float | None = None,
    request_timeout: float,
) -> Op[GradeResult]:
    """POST …/grade. The call lasts as long as the grader: its HTTP timeout
    is the grader's (default 300 s) plus two minutes for the sandbox."""
    if not isinstance(tests_layer, str) or not tests_layer:
        raise InvalidArgumentError("tests_layer must name the layer with the pristine tests")
    body: dict[str, Any] = {"tests_layer": tests_layer}
    if isinstance(command, str):
        if not command.strip():
            raise InvalidArgumentError("command is empty")
        body["command"] = command
    else:
        argv = list(command)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise InvalidArgumentError("command must be a command line or a non-empty list of strings")
        body["cmd"] = argv
    for key, value in (("report", report), ("reporter", reporter), ("cwd", cwd)):
        if value is not None:
            body[key] = value
    for key, seq in (("carry", carry), ("sealed", sealed), ("protected", protected)):
        if seq is not None:
            if isinstance(seq, str):
                raise InvalidArgumentError(f"{key} must be a list of paths, not a string")
            body[key] = list(seq)
    if expected_tests is not None:
        body["expected_tests"] = int(expected_tests)
    if envs:
        body["env"] = dict(envs)
    if timeout_s is not None:
        body["timeout_s"] = float(timeout_s)
    wait = (timeout_s or 300) + 120 + request_timeout
    resp = yield Call("POST", sandbox_path(sandbox_id, "grade"), wait, json=body)
    return GradeResult.from_json(json_body(resp))


def sandbox_stats(sandbox_id: str, timeout: float) -> Op[SandboxStats]:
    resp = yield Call("GET", sandbox_path(sandbox_id, "stats"), timeout)
    return SandboxStats.from_json(json_body(resp))


def set_timeout(sandbox_id: str, seconds: int, timeout: float) -> Op[SandboxInfo]:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 1:
        raise InvalidArgumentError(f"timeout must be at least 1 second, not {seconds!r}")
    resp = yield Call("POST", sandbox_path(sandbox_id, "timeout"), timeout, json={"timeout_s": int(seconds)})
    return SandboxInfo.from_json(json_body(resp))


# --------------------------------------------------------------- commands


def exec_body(
    cmd: str | Iterable[str],
    *,
    envs: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdin: str | bytes | None = None,
    timeout: float | None = None,
    max_output_bytes: int | None = None,
) -> dict[str, Any]:
    """The ExecRequest: a str is a command line ("command"), a list is argv ("cmd")."""
    body: dict[str, Any] = {}
    if isinstance(cmd, str):
        if not cmd.strip():
            raise InvalidArgumentError("cmd is empty")
        body["command"] = cmd
    else:
        argv = list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
            raise InvalidArgumentError("cmd must be a non-empty list of strings")
        body["cmd"] = argv
    env = str_map(envs, "envs")
    if env:
        body["env"] = env
    if cwd:
        body["cwd"] = cwd
    if stdin is not None:
        body["stdin"] = _text(stdin, "stdin")
    if _positive(timeout, "timeout") is not None:
        body["timeout_s"] = timeout
    if max_output_bytes is not None:
        if isinstance(max_output_bytes, bool) or not isinstance(max_output_bytes, int) or max_output_bytes < 1:
            raise InvalidArgumentError("max_output_bytes must be a positive integer")
        body["max_output_bytes"] = max_output_bytes
    return body


def exec_request_timeout(command_timeout: float | None, request_timeout: float | None, default: float) -> float:
    """The request timeout for a command: its own timeout plus a margin.

    An explicit request_timeout wins; the margin is the sandbox's request
    timeout. Without a command timeout the server's default (60 s) applies.
    """
    explicit = _positive(request_timeout, "request_timeout")
    if explicit is not None:
        return float(explicit)
    return float(command_timeout or SERVER_COMMAND_TIMEOUT) + default


def check_result(result: CommandResult) -> CommandResult:
    """Raise TimeoutError or CommandExitError for a command that did not succeed."""
    if result.timed_out:
        raise TimeoutError(
            f"command timed out after {result.duration_ms / 1000:.1f}s" + (f" ({result.error})" if result.error else ""),
            code="command_timeout",
            result=result,
        )
    if result.exit_code != 0:
        raise CommandExitError(result)
    return result


def exec_command(sandbox_id: str, body: dict[str, Any], timeout: float) -> Op[CommandResult]:
    resp = yield Call("POST", sandbox_path(sandbox_id, "exec"), timeout, json=body)
    return CommandResult.from_json(json_body(resp))


def exec_stream_call(sandbox_id: str, body: dict[str, Any], timeout: float) -> Call:
    path = sandbox_path(sandbox_id, "exec", "stream")
    return Call("POST", path, timeout, json=body, headers={"Accept": "application/x-ndjson"})


class ExecStream:
    """Parses the NDJSON ExecEvents of POST …/exec/stream as bytes arrive.

    feed() returns the ("stdout"|"stderr", text) chunks to hand to callbacks
    and accumulates them; finish() returns the CommandResult with the
    accumulated output. An error event raises the mapped SandboxError.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._out: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.result: CommandResult | None = None
        self.pid: int | None = None

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        out: list[tuple[str, str]] = []
        for line in lines:
            self._event(line, out)
        return out

    def _event(self, line: bytes, out: list[tuple[str, str]]) -> None:
        line = line.strip()
        if not line:
            return
        try:
            ev = json.loads(line)
        except ValueError:
            raise SandboxError(f"bad line in the exec stream: {line[:200]!r}", code="invalid_response") from None
        kind = ev.get("type")
        if kind in ("stdout", "stderr"):
            data = ev.get("data") or ""
            if data:
                self._out[kind].append(data)
                out.append((kind, data))
        elif kind == "start":
            self.pid = ev.get("pid")
        elif kind == "exit":
            self.result = CommandResult.from_json(ev.get("result") or {})
        elif kind == "error":
            raise error_from_body(ev.get("error") or {"message": "the command failed"})

    def finish(self) -> CommandResult:
        rest: list[tuple[str, str]] = []
        if self._buf:
            self._event(self._buf, rest)
            self._buf = b""
        if self.result is None:
            raise ConnectionError("the exec stream ended without an exit event", code="stream_ended")
        self.result.stdout = "".join(self._out["stdout"])
        self.result.stderr = "".join(self._out["stderr"])
        return self.result


def start_process(sandbox_id: str, body: dict[str, Any], timeout: float) -> Op[ProcessInfo]:
    resp = yield Call("POST", sandbox_path(sandbox_id, "processes"), timeout, json=body)
    return ProcessInfo.from_json(json_body(resp))


def list_processes(sandbox_id: str, timeout: float) -> Op[list[ProcessInfo]]:
    resp = yield Call("GET", sandbox_path(sandbox_id, "processes"), timeout)
    return [ProcessInfo.from_json(p) for p in json_body(resp).get("processes") or []]


def get_process(sandbox_id: str, pid: int, timeout: float) -> Op[ProcessInfo]:
    resp = yield Call("GET", sandbox_path(sandbox_id, "processes", str(int(pid))), timeout)
    return ProcessInfo.from_json(json_body(resp))


def wait_process(sandbox_id: str, pid: int, wait: float | None, timeout: float) -> Op[CommandResult]:
    """Wait for a background process; wait=None waits for as long as it runs.

    A wait that expires raises TimeoutError (the server's 504).
    """
    path = sandbox_path(sandbox_id, "processes", str(int(pid)), "wait")
    while True:
        slice_s = WAIT_SLICE if wait is None else _positive(wait, "timeout")
        assert slice_s is not None
        try:
            resp = yield Call("POST", path, slice_s + timeout, params=[("timeout_s", f"{slice_s:g}")])
        except TimeoutError as e:
            if wait is None and e.status == 504:
                continue
            raise
        return CommandResult.from_json(json_body(resp))


def send_stdin(sandbox_id: str, pid: int, data: str | bytes, timeout: float) -> Op[None]:
    path = sandbox_path(sandbox_id, "processes", str(int(pid)), "stdin")
    yield Call("POST", path, timeout, json={"data": _text(data, "data")})


def close_stdin(sandbox_id: str, pid: int, timeout: float) -> Op[None]:
    yield Call("POST", sandbox_path(sandbox_id, "processes", str(int(pid)), "stdin", "close"), timeout)


def kill_process(sandbox_id: str, pid: int, signal: str, timeout: float) -> Op[bool]:
    """Signal a background process: False if there was no such process."""
    path = sandbox_path(sandbox_id, "processes", str(int(pid)), "kill")
    try:
        yield Call("POST", path, timeout, json={"signal": signal or "KILL"})
    except NotFoundError as e:
        if _sandbox_gone(e):
            raise
        return False
    return True


# ------------------------------------------------------------------ files


def _path(path: str) -> str:
    if not isinstance(path, str) or not path:
        raise InvalidArgumentError("path must be a non-empty string")
    return path


def read_call(sandbox_id: str, path: str, timeout: float) -> Call:
    return Call("GET", sandbox_path(sandbox_id, "files"), timeout, params=[("path", _path(path))])


def read_file(sandbox_id: str, path: str, timeout: float) -> Op[bytes]:
    resp = yield read_call(sandbox_id, path, timeout)
    return resp.content


def write_file(
    sandbox_id: str, path: str, data: BodyData, mode: int | str | None, parents: bool, timeout: float
) -> Op[EntryInfo]:
    params = [("path", _path(path)), ("parents", _bool(parents))]
    if mode is not None:
        if isinstance(mode, int) and not isinstance(mode, bool):
            params.append(("mode", f"{mode:04o}"))
        elif isinstance(mode, str) and mode.isdigit():
            params.append(("mode", mode))
        else:
            raise InvalidArgumentError(f"mode must be an int (0o644) or an octal string ('0644'), not {mode!r}")
    try:
        resp = yield Call("PUT", sandbox_path(sandbox_id, "files"), timeout, params=params, body=Body(data))
    except ConnectionError as e:
        if e.code != "write_failed":
            raise
        # The server refused the upload before reading all of it, and httpx
        # lost its answer. Ask a cheap question that fails the same way if
        # the sandbox is gone or the path is refused, to raise that error.
        yield Call("GET", sandbox_path(sandbox_id, "files", "exists"), timeout, params=params[:1])
        raise
    return EntryInfo.from_json(json_body(resp))


def list_files(sandbox_id: str, path: str, depth: int, timeout: float) -> Op[list[EntryInfo]]:
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 32:
        raise InvalidArgumentError(f"depth must be an integer from 1 to 32, not {depth!r}")
    params = [("path", _path(path)), ("depth", str(depth))]
    resp = yield Call("GET", sandbox_path(sandbox_id, "files", "list"), timeout, params=params)
    return [EntryInfo.from_json(e) for e in json_body(resp).get("entries") or []]


def stat_file(sandbox_id: str, path: str, timeout: float) -> Op[EntryInfo]:
    resp = yield Call("GET", sandbox_path(sandbox_id, "files", "stat"), timeout, params=[("path", _path(path))])
    return EntryInfo.from_json(json_body(resp))


def file_exists(sandbox_id: str, path: str, timeout: float) -> Op[bool]:
    resp = yield Call("GET", sandbox_path(sandbox_id, "files", "exists"), timeout, params=[("path", _path(path))])
    return bool(json_body(resp).get("exists"))


def remove_file(sandbox_id: str, path: str, recursive: bool, timeout: float) -> Op[None]:
    params = [("path", _path(path)), ("recursive", _bool(recursive))]
    yield Call("DELETE", sandbox_path(sandbox_id, "files"), timeout, params=params)


def make_dir(sandbox_id: str, path: str, parents: bool, timeout: float) -> Op[bool]:
    """Make a directory: True if made, False if it already existed (as E2B).

    It asks without parents first, so that an existing directory is a 409
    whatever the server does for mkdir -p; only a missing parent (404) makes
    it ask again with parents.
    """
    call_path = sandbox_path(sandbox_id, "files", "mkdir")
    try:
        yield Call("POST", call_path, timeout, json={"path": _path(path)})
        return True
    except (ConflictError, NotFoundError) as e:
        if _sandbox_gone(e) or (isinstance(e, NotFoundError) and not parents):
            raise
        if isinstance(e, ConflictError):
            return False
    try:
        yield Call("POST", call_path, timeout, json={"path": path, "parents": True})
    except ConflictError as e:
        if _sandbox_gone(e):
            raise
        return False
    return True


def rename_file(sandbox_id: str, old: str, new: str, timeout: float) -> Op[EntryInfo]:
    body = {"from": _path(old), "to": _path(new)}
    resp = yield Call("POST", sandbox_path(sandbox_id, "files", "rename"), timeout, json=body)
    return EntryInfo.from_json(json_body(resp))


# ---------------------------------------------------------- layers, images

# Roles in the order they stack when given as a mapping.
STANDARD_ROLES = ("base", "workspace", "toolkit")
# Content-Type of layer uploads.
TAR_TYPE = "application/x-tar"
LAYER_KINDS = ("tar", "oci")


def ref_path(prefix: str, ref: str, what: str) -> str:
    """prefix/ref with each '/'-separated segment of ref escaped, the '/' kept.

    References are name:version (names may contain '/') or IDs (sha256:…).
    """
    if not isinstance(ref, str) or not ref:
        raise InvalidArgumentError(f"{what} reference must be a non-empty string")
    segs = ref.split("/")
    if any(s in ("", ".", "..") for s in segs):
        raise InvalidArgumentError(f"{what} reference {ref!r} has an empty, '.' or '..' path segment")
    return prefix + "/" + "/".join(quote(s, safe=":@+") for s in segs)


def layer_list(layers: LayersSpec) -> list[dict[str, str]]:
    """The ImageLayer list (bottom first) of a mapping or a sequence of pairs."""
    if isinstance(layers, Mapping):
        roles = [r for r in STANDARD_ROLES if r in layers] + [r for r in layers if r not in STANDARD_ROLES]
        pairs = [(r, layers[r]) for r in roles]
    elif isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise InvalidArgumentError("layers must be a mapping of role to reference or a list of (role, reference)")
    else:
        pairs = []
        for item in layers:
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise InvalidArgumentError(f"layers must hold (role, reference) pairs, not {item!r}")
            pairs.append((item[0], item[1]))
    out = []
    for role, ref in pairs:
        if not isinstance(role, str) or not role or not isinstance(ref, str) or not ref:
            raise InvalidArgumentError(f"layer role and reference must be non-empty strings, not {role!r}: {ref!r}")
        out.append({"role": role, "id": ref})
    if not out:
        raise InvalidArgumentError("layers is empty")
    return out


def image_body(
    name: str,
    *,
    base: str | None,
    workspace: str | None,
    toolkit: str | None,
    layers: LayersSpec | None,
    tiers: Iterable[str] | None,
) -> dict[str, Any]:
    """The CreateImageRequest: base/workspace/toolkit as the API's shorthand,
    or, with layers too, all of them as one list (those three first)."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError("image name must be a non-empty string (name:tag)")
    body: dict[str, Any] = {"name": name}
    short = {"base": base, "workspace": workspace, "toolkit": toolkit}
    for role, ref in short.items():
        if ref is not None and (not isinstance(ref, str) or not ref):
            raise InvalidArgumentError(f"{role} must be a non-empty layer reference, not {ref!r}")
    given = {role: ref for role, ref in short.items() if ref}
    if layers is not None:
        body["layers"] = [{"role": r, "id": ref} for r, ref in given.items()] + layer_list(layers)
    elif given:
        body.update(given)
    else:
        raise InvalidArgumentError("an image needs layers: pass base=, workspace=, toolkit= or layers=")
    if tiers is not None:
        if isinstance(tiers, str):
            tiers = [tiers]
        tl = list(tiers)
        if not all(isinstance(t, str) and t for t in tl):
            raise InvalidArgumentError("tiers must be a list of tier names")
        if tl:
            body["tiers"] = tl
    return body


def list_layers(timeout: float) -> Op[list[LayerInfo]]:
    resp = yield Call("GET", "/v1/layers", timeout)
    return [LayerInfo.from_json(x) for x in json_body(resp).get("layers") or []]


def get_layer(ref: str, timeout: float) -> Op[LayerInfo]:
    resp = yield Call("GET", ref_path("/v1/layers", ref, "layer"), timeout)
    return LayerInfo.from_json(json_body(resp))


def delete_layer(ref: str, timeout: float) -> Op[None]:
    yield Call("DELETE", ref_path("/v1/layers", ref, "layer"), timeout)


def layer_params(kind: str, name: str | None) -> list[tuple[str, str]]:
    if kind not in LAYER_KINDS:
        raise InvalidArgumentError(f"kind must be 'tar' or 'oci', not {kind!r}")
    params = [("kind", kind)]
    if name is not None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("name must be a non-empty string (name:version)")
        params.append(("name", name))
    return params


def upload_layer(params: list[tuple[str, str]], body: Body, timeout: float) -> Op[LayerInfo]:
    resp = yield Call("POST", "/v1/layers", timeout, params=params, body=body)
    return LayerInfo.from_json(json_body(resp))


def list_images(timeout: float) -> Op[list[ImageInfo]]:
    resp = yield Call("GET", "/v1/images", timeout)
    return [ImageInfo.from_json(x) for x in json_body(resp).get("images") or []]


def get_image(ref: str, timeout: float) -> Op[ImageInfo]:
    resp = yield Call("GET", ref_path("/v1/images", ref, "image"), timeout)
    return ImageInfo.from_json(json_body(resp))


def create_image(body: dict[str, Any], timeout: float) -> Op[ImageInfo]:
    resp = yield Call("POST", "/v1/images", timeout, json=body)
    return ImageInfo.from_json(json_body(resp))


def tag_image(ref: str, name: str, timeout: float) -> Op[ImageInfo]:
    for what, v in (("image", ref), ("name", name)):
        if not isinstance(v, str) or not v:
            raise InvalidArgumentError(f"{what} must be a non-empty string")
    resp = yield Call("POST", "/v1/images/tag", timeout, json={"image": ref, "name": name})
    return ImageInfo.from_json(json_body(resp))


def delete_image(ref: str, timeout: float) -> Op[None]:
    yield Call("DELETE", ref_path("/v1/images", ref, "image"), timeout)


# ----------------------------------------- trajectories, snapshots, forks

# Extra seconds on top of the request timeout for calls that store or
# start a lot: a snapshot writes the sandbox's whole writable layer, a
# fork starts count sandboxes, a resume replays a rollout.
SNAPSHOT_WAIT = 120.0
FORK_WAIT = 300.0
RESUME_WAIT = 600.0
# STEPS_PAGE is how many steps one request asks for.
STEPS_PAGE = 500
_DIVERGENCE = ("stop", "continue")


def trajectory_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"a trajectory ID must be a non-empty string, not {value!r}")
    return value


def trajectory_path(traj_id: str, *rest: str) -> str:
    """/v1/trajectories/{id}/…: the ID ("run-42/task-7") is one path
    segment, its "/" escaped as %2F, as the server matches it."""
    return "/".join(["/v1/trajectories", quote(trajectory_id(traj_id), safe="")] + list(rest))


def snapshot_path(snapshot_id: str) -> str:
    if not isinstance(snapshot_id, str) or not snapshot_id:
        raise InvalidArgumentError(f"a snapshot ID must be a non-empty string, not {snapshot_id!r}")
    return "/v1/snapshots/" + quote(snapshot_id, safe="")


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{what} must be an integer, not {value!r}")
    return value


def snapshot_sandbox(sandbox_id: str, timeout: float) -> Op[Snapshot]:
    resp = yield Call("POST", sandbox_path(sandbox_id, "snapshot"), timeout + SNAPSHOT_WAIT)
    return Snapshot.from_json(json_body(resp))


def fork_body(count: int, timeout: int | None, labels: Mapping[str, str] | None) -> dict[str, Any]:
    """The ForkRequest. The count's range is the server's to check (code
    invalid_fork_count), so that its maximum is said in one place."""
    body: dict[str, Any] = {"count": _count(count, "count")}
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 1:
            raise InvalidArgumentError(f"timeout must be at least 1 second, not {timeout!r}")
        body["timeout_s"] = int(timeout)
    lm = str_map(labels, "labels")
    if lm:
        body["labels"] = lm
    return body


def fork_sandbox(sandbox_id: str, body: dict[str, Any], timeout: float) -> Op[ForkResult]:
    resp = yield Call("POST", sandbox_path(sandbox_id, "fork"), timeout + FORK_WAIT, json=body)
    return ForkResult.from_json(json_body(resp))


def get_snapshot(snapshot_id: str, timeout: float) -> Op[Snapshot]:
    resp = yield Call("GET", snapshot_path(snapshot_id), timeout)
    return Snapshot.from_json(json_body(resp))


def delete_snapshot(snapshot_id: str, timeout: float) -> Op[bool]:
    """Delete a snapshot: True if deleted, False if there was none."""
    try:
        yield Call("DELETE", snapshot_path(snapshot_id), timeout)
    except NotFoundError:
        return False
    return True


def resume_body(
    secret_env: Mapping[str, str] | None,
    on_divergence: str | None,
    tier: str | None,
    from_scratch: bool,
    timeout: int | None,
) -> dict[str, Any]:
    """The ResumeRequest. on_divergence is checked by the server too
    (invalid_on_divergence); a value it cannot be is refused here."""
    body: dict[str, Any] = {}
    secrets = str_map(secret_env, "secret_env")
    if secrets:
        body["secret_env"] = secrets
    if on_divergence is not None:
        if not isinstance(on_divergence, str):
            raise InvalidArgumentError(f"on_divergence must be \"stop\" or \"continue\", not {on_divergence!r}")
        body["on_divergence"] = on_divergence
    if tier:
        body["tier"] = tier
    if from_scratch:
        body["from_scratch"] = True
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 1:
            raise InvalidArgumentError(f"timeout must be at least 1 second, not {timeout!r}")
        body["timeout_s"] = int(timeout)
    return body


def resume_trajectory(traj_id: str, body: dict[str, Any], timeout: float) -> Op[ResumeResult]:
    resp = yield Call("POST", trajectory_path(traj_id, "resume"), timeout + RESUME_WAIT, json=body)
    return ResumeResult.from_json(json_body(resp))


def get_trajectory(traj_id: str, timeout: float) -> Op[Trajectory]:
    resp = yield Call("GET", trajectory_path(traj_id), timeout)
    return Trajectory.from_json(json_body(resp))


def delete_trajectory(traj_id: str, timeout: float) -> Op[bool]:
    """Delete a trajectory: True if deleted, False if there was none."""
    try:
        yield Call("DELETE", trajectory_path(traj_id), timeout)
    except NotFoundError:
        return False
    return True


def list_trajectories_page(
    page_token: str | None, limit: int | None, timeout: float
) -> Op[tuple[list[Trajectory], str | None]]:
    params: list[tuple[str, str]] = []
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidArgumentError(f"limit must be an integer from 1 to 1000, not {limit!r}")
        params.append(("limit", str(limit)))
    if page_token:
        params.append(("page_token", page_token))
    resp = yield Call("GET", "/v1/trajectories", timeout, params=params)
    d = json_body(resp)
    return [Trajectory.from_json(t) for t in d.get("trajectories") or []], d.get("next_page_token") or None


def list_trajectories(limit: int | None, timeout: float) -> Op[list[Trajectory]]:
    """Every page of the listing, following next_page_token to the end."""
    out: list[Trajectory] = []
    seen: set[str] = set()
    token: str | None = None
    while True:
        items, token = yield from list_trajectories_page(token, limit, timeout)
        out.extend(items)
        if not token:
            return out
        if token in seen:
            raise SandboxError(f"the server repeated page token {token!r}", code="invalid_response")
        seen.add(token)


def steps_page(traj_id: str, after: int, limit: int, timeout: float) -> Op[tuple[list[TrajectoryStep], int | None]]:
    """The steps after step number ``after``, and the ``after`` of the
    next page (None after the last). A next page that would not move
    forward is the server's error, not a loop."""
    after = _count(after, "after")
    if after < 0:
        raise InvalidArgumentError("after must be ≥ 0")
    params = [("after", str(after)), ("limit", str(limit))] if after else [("limit", str(limit))]
    resp = yield Call("GET", trajectory_path(traj_id, "steps"), timeout, params=params)
    d = json_body(resp)
    steps = [TrajectoryStep.from_json(s) for s in d.get("steps") or []]
    token = d.get("next_page_token")
    if not token:
        return steps, None
    try:
        nxt = int(token)
    except (TypeError, ValueError):
        nxt = after
    if nxt <= after:
        raise SandboxError(f"the server sent page token {token!r} after step {after}", code="invalid_response")
    return steps, nxt


def export_call(traj_id: str) -> Call:
    """GET …/export: every step as JSONL. Streamed: only the read timeout
    between chunks bounds it."""
    return Call("GET", trajectory_path(traj_id, "export"), EXPORT_TIMEOUT, headers={"Accept": "application/x-ndjson"})


# EXPORT_TIMEOUT bounds each read of an export's stream, and the wait for
# it to start.
EXPORT_TIMEOUT = 300.0


def blob_call(traj_id: str, digest: str, timeout: float) -> Call:
    if not isinstance(digest, str) or not digest:
        raise InvalidArgumentError(f"a blob digest must be a non-empty string (sha256:…), not {digest!r}")
    return Call(
        "GET", trajectory_path(traj_id, "blobs", quote(digest, safe=":")), timeout,
        headers={"Accept": "application/octet-stream"},
    )


def read_blob(traj_id: str, digest: str, timeout: float) -> Op[bytes]:
    resp = yield blob_call(traj_id, digest, timeout)
    return resp.content


def list_nodes(timeout: float) -> Op[list[NodeInfo]]:
    resp = yield Call("GET", "/v1/nodes", timeout)
    return [NodeInfo.from_json(x) for x in json_body(resp).get("nodes") or []]


def _node_path(node: str, action: str) -> str:
    if not isinstance(node, str) or not node:
        raise InvalidArgumentError("node must be a non-empty node ID")
    return f"/v1/nodes/{quote(node, safe='')}/{action}"


def cordon_node(node: str, on: bool, timeout: float) -> Op[NodeInfo]:
    resp = yield Call("POST", _node_path(node, "cordon" if on else "uncordon"), timeout)
    return NodeInfo.from_json(json_body(resp))


def drain_node(node: str, deadline_s: int | None, timeout: float) -> Op[NodeInfo]:
    body: dict[str, Any] = {}
    if deadline_s is not None:
        if isinstance(deadline_s, bool) or not isinstance(deadline_s, int) or deadline_s <= 0:
            raise InvalidArgumentError("deadline_s must be a positive number of seconds")
        body["deadline_s"] = deadline_s
    resp = yield Call("POST", _node_path(node, "drain"), timeout, json=body)
    return NodeInfo.from_json(json_body(resp))
