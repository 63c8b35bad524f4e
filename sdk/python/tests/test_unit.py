"""Unit tests that need no server: error mapping, configuration, request
building, stream parsing and the retry loop (on httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import io
import json
import pickle
from email.utils import formatdate
from typing import Any

import httpx
import pytest

import libdsec
from libdsec import _config, _ops
from libdsec._calls import Body, Call, error_retry_delay, transport_retry_delay
from libdsec._config import ClientOptions
from libdsec.errors import (
    AuthenticationError,
    CommandExitError,
    ConflictError,
    ConnectionError,
    InvalidArgumentError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    SandboxError,
    ServerError,
    TimeoutError,
    UnsupportedError,
    error_from_response,
    parse_retry_after,
)

# ------------------------------------------------------------ error mapping


def _err(status: int, body: Any = None, headers: dict[str, str] | None = None, text: str | None = None) -> SandboxError:
    if text is not None:
        resp = httpx.Response(status, text=text, headers=headers)
    elif body is not None:
        resp = httpx.Response(status, json=body, headers=headers)
    else:
        resp = httpx.Response(status, headers=headers)
    return error_from_response(resp)


def test_rate_limit_error_parsing() -> None:
    e = _err(
        429,
        {"code": "rate_limited", "message": "too many creates", "class": "rate_limited"},
        headers={"Retry-After": "7"},
    )
    assert type(e) is RateLimitError
    assert e.retry_after == 7.0
    assert (e.code, e.message, e.class_, e.status) == ("rate_limited", "too many creates", "rate_limited", 429)
    assert "too many creates" in str(e) and "429" in str(e)
    assert isinstance(e, SandboxError)


def test_retry_after_http_date() -> None:
    now = 1_800_000_000.0
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now=now) == 0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    e = _err(429, text="slow down")
    assert isinstance(e, RateLimitError) and e.retry_after is None


@pytest.mark.parametrize(
    "status,class_,want",
    [
        (400, "invalid_argument", InvalidArgumentError),
        (401, "unauthenticated", AuthenticationError),
        (403, "permission_denied", libdsec.PermissionDeniedError),
        (404, "not_found", NotFoundError),
        (409, "conflict", ConflictError),
        (413, "too_large", PayloadTooLargeError),
        (422, "unsupported", UnsupportedError),
        (429, "rate_limited", RateLimitError),
        (503, "unavailable", ServerError),
        (504, "deadline_exceeded", TimeoutError),
        (500, "internal", ServerError),
    ],
)
def test_error_classes(status: int, class_: str, want: type[SandboxError]) -> None:
    e = _err(status, {"code": "some_code", "message": "msg", "class": class_})
    assert type(e) is want
    assert (e.code, e.message, e.class_, e.status) == ("some_code", "msg", class_, status)
    # Without the class, the status alone picks the same exception.
    e2 = _err(status, {"code": "some_code", "message": "msg"})
    assert type(e2) is want


def test_sandbox_not_running() -> None:
    e = _err(409, {"code": "sandbox_not_running", "message": "sandbox x is stopped", "class": "conflict"})
    assert type(e) is libdsec.SandboxNotRunningError
    assert isinstance(e, NotFoundError) and isinstance(e, ConflictError) and e.status == 409


def test_permission_denied_is_not_authentication() -> None:
    """A 403 (the sandbox refuses) is not a 401 (the token is bad); a write
    a phase refuses is a ReadOnlyError, whatever the tier's code."""
    for code in ("read_only", "read_only_path"):
        e = _err(403, {"code": code, "message": "/etc/x is read-only", "class": "permission_denied"})
        assert type(e) is libdsec.ReadOnlyError and isinstance(e, libdsec.PermissionDeniedError), e
        assert not isinstance(e, AuthenticationError)
    e = _err(403, {"code": "executable_not_allowed", "message": "no", "class": "permission_denied"})
    assert type(e) is libdsec.PermissionDeniedError and not isinstance(e, AuthenticationError)


def test_class_wins_over_status() -> None:
    e = _err(400, {"code": "no_shell", "message": "the function tier has no shell", "class": "unsupported"})
    assert isinstance(e, UnsupportedError)


def test_non_json_bodies() -> None:
    e = _err(502, text="<html><body>Bad Gateway from proxy</body></html>")
    assert type(e) is ServerError and e.status == 502 and "Bad Gateway from proxy" in e.message
    assert e.code is None and e.class_ is None
    e = _err(404)
    assert type(e) is NotFoundError and e.message == "HTTP 404 Not Found"
    e = _err(418, {"unexpected": "shape"})
    assert type(e) is SandboxError and e.status == 418
    e = _err(503, text="", headers={"Retry-After": "2"})
    assert isinstance(e, ServerError) and e.retry_after == 2.0


def test_builtin_exception_bases() -> None:
    t = TimeoutError("x")
    assert isinstance(t, builtins.TimeoutError) and isinstance(t, SandboxError)
    c = ConnectionError("y")
    assert isinstance(c, builtins.ConnectionError) and isinstance(c, SandboxError)
    assert libdsec.TimeoutError is TimeoutError and libdsec.errors.RateLimitError is RateLimitError


def test_errors_pickle() -> None:
    r = libdsec.CommandResult(stdout="o", stderr="e", exit_code=2)
    errs: list[SandboxError] = [
        CommandExitError(r),
        TimeoutError("t", code="command_timeout", result=r),
        RateLimitError("slow", code="rate_limited", status=429, retry_after=3.0),
        ConnectionError("down", code="connection_error"),
        _err(404, {"code": "sandbox_not_found", "message": "gone", "class": "not_found"}),
    ]
    for e in errs:
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e) and back.__dict__ == e.__dict__


def test_command_exit_error_carries_result() -> None:
    r = libdsec.CommandResult(stdout="out", stderr="boom", exit_code=3)
    with pytest.raises(CommandExitError) as ei:
        _ops.check_result(r)
    e = ei.value
    assert (e.exit_code, e.stdout, e.stderr, e.result) == (3, "out", "boom", r)
    assert "3" in str(e) and "boom" in str(e)
    t = libdsec.CommandResult(stdout="", stderr="", exit_code=-1, timed_out=True, error="timeout", duration_ms=1000)
    with pytest.raises(TimeoutError) as ti:
        _ops.check_result(t)
    assert ti.value.result is t and ti.value.exit_code == -1
    ok = libdsec.CommandResult(stdout="x", stderr="", exit_code=0)
    assert _ops.check_result(ok) is ok


# ------------------------------------------------------------ configuration


def test_url_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSEC_URL", raising=False)
    assert _config.resolve_url() == "http://127.0.0.1:7878"
    monkeypatch.setenv("DSEC_URL", "http://example.invalid:9/")
    assert _config.resolve_url() == "http://example.invalid:9"
    assert _config.resolve_url("https://x.invalid") == "https://x.invalid"
    assert _config.resolve_url("127.0.0.1:8000") == "http://127.0.0.1:8000"
    with pytest.raises(InvalidArgumentError):
        _config.resolve_url("ftp://x")


def test_token_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("DSEC_TOKEN", raising=False)
    missing = str(tmp_path / "no-token")
    with pytest.raises(AuthenticationError) as ei:
        _config.resolve_token(None, token_file=missing)
    assert "DSEC_TOKEN" in str(ei.value) and missing in str(ei.value)
    f = tmp_path / "token"
    f.write_text("file-token\n")
    assert _config.resolve_token(None, token_file=str(f)) == "file-token"
    monkeypatch.setenv("DSEC_TOKEN", "env-token")
    assert _config.resolve_token(None, token_file=str(f)) == "env-token"
    assert _config.resolve_token("explicit", token_file=str(f)) == "explicit"


def test_client_without_token_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("DSEC_TOKEN", raising=False)
    monkeypatch.setattr(_config, "DEFAULT_TOKEN_FILE", str(tmp_path / "absent"))
    with pytest.raises(AuthenticationError):
        libdsec.Sandbox.create(url="http://127.0.0.1:1")


# --------------------------------------------------------- request building


def test_exec_body() -> None:
    assert _ops.exec_body("echo hi") == {"command": "echo hi"}
    assert _ops.exec_body(["echo", "a b"], timeout=5, envs={"A": "1"}, cwd="/w", stdin=b"in", max_output_bytes=10) == {
        "cmd": ["echo", "a b"],
        "timeout_s": 5,
        "env": {"A": "1"},
        "cwd": "/w",
        "stdin": "in",
        "max_output_bytes": 10,
    }
    for bad in ([], "  ", [""], ["ok", 3]):
        with pytest.raises(InvalidArgumentError):
            _ops.exec_body(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        _ops.exec_body("x", timeout=0)
    with pytest.raises(InvalidArgumentError):
        _ops.exec_body("x", stdin=b"\xff\xfe")
    with pytest.raises(InvalidArgumentError):
        _ops.exec_body("x", envs={"A": 1})  # type: ignore[dict-item]


def test_grade_call() -> None:
    op = _ops.grade("sb-1", "tests/t:1", ["sh", "run.sh"], reporter="/usr/bin/go-junit-report",
                    expected_tests=2, request_timeout=30)
    call = next(op)
    assert call.method == "POST" and call.path.endswith("/sb-1/grade")
    assert call.json == {"tests_layer": "tests/t:1", "cmd": ["sh", "run.sh"],
                                   "reporter": "/usr/bin/go-junit-report", "expected_tests": 2}
    with pytest.raises(InvalidArgumentError):
        next(_ops.grade("sb-1", "", "pytest", request_timeout=30))


def test_audit_event_target() -> None:
    e = libdsec.AuditEvent.from_json({"sandbox": "sb-1", "kind": "syscall", "syscall": "rename",
                                      "path": "/w/sedAb12", "target": "/w/x_test.go", "verdict": "allowed",
                                      "severity": "high", "rule": "test-tampering"})
    assert (e.path, e.target, e.rule) == ("/w/sedAb12", "/w/x_test.go", "test-tampering")
    assert libdsec.AuditEvent.from_json({"kind": "exec"}).target == ""


def test_exec_request_timeout() -> None:
    assert _ops.exec_request_timeout(10, None, 30) == 40
    assert _ops.exec_request_timeout(None, None, 30) == 90  # server default 60 s + margin
    assert _ops.exec_request_timeout(10, 5, 30) == 5


def test_create_body() -> None:
    body = _ops.create_body(
        tier="function", image=None, timeout=300, cpu=None, memory_mb=64, disk_mb=None,
        envs={"E": "v"}, metadata={"a": "1"}, labels={"b": "2"},
    )
    assert body == {"tier": "function", "timeout_s": 300, "memory_mb": 64, "env": {"E": "v"}, "labels": {"b": "2", "a": "1"}}
    with pytest.raises(InvalidArgumentError):
        _ops.create_body(tier="function", image=None, timeout=0, cpu=None, memory_mb=None, disk_mb=None,
                         envs=None, metadata=None, labels=None)


def test_create_body_network() -> None:
    def body(network: Any) -> dict[str, Any]:
        return _ops.create_body(tier="container", image=None, timeout=None, cpu=None, memory_mb=None, disk_mb=None,
                                envs=None, metadata=None, labels=None, network=network)

    assert "network" not in body(None)
    assert body("open")["network"] == {"egress": "open"}
    policy = {"egress": "allowlist", "allow": [{"cidr": "203.0.113.0/24", "proto": "tcp", "ports": 443}, {"host": "pypi.org"}]}
    assert body(policy)["network"] == {
        "egress": "allowlist",
        "allow": [{"cidr": "203.0.113.0/24", "proto": "tcp", "ports": "443"}, {"host": "pypi.org"}],
    }
    # The shape is checked here, the values by the server.
    assert body({"egress": "sometimes"})["network"] == {"egress": "sometimes"}
    for bad in (3, ["open"], {"egress": 1}, {"mode": "open"}, {"allow": {"cidr": "1.2.3.4"}},
                {"allow": ["1.2.3.4"]}, {"allow": [{"cidr": "1.2.3.4", "port": "80"}]}, {"allow": [{"cidr": None}]}):
        with pytest.raises(InvalidArgumentError):
            body(bad)


def test_list_params() -> None:
    p = _ops.list_params(metadata={"b": "2", "a": "1"}, state="running", tier="vm", limit=5, page_token="t")
    assert p == [("label", "a=1"), ("label", "b=2"), ("state", "running"), ("tier", "vm"), ("limit", "5"), ("page_token", "t")]
    with pytest.raises(InvalidArgumentError):
        _ops.list_params(metadata=None, state=None, tier=None, limit=0, page_token=None)


def _drive(op: Any, responses: list[Any]) -> tuple[Any, list[Call]]:
    """Run an op generator against canned responses (an exception is thrown in)."""
    calls: list[Call] = []
    try:
        call = next(op)
        for r in responses:
            calls.append(call)
            call = op.throw(r) if isinstance(r, BaseException) else op.send(r)
    except StopIteration as s:
        return s.value, calls
    raise AssertionError(f"op wanted more than {len(responses)} responses")


def test_write_file_call() -> None:
    info = {"name": "f", "path": "/workspace/f", "type": "file", "size": 2, "mode": 416, "mtime": "2026-01-02T03:04:05.123456789Z"}
    got, calls = _drive(_ops.write_file("sb1", "f", b"hi", 0o640, True, 30), [httpx.Response(200, json=info)])
    (c,) = calls
    assert (c.method, c.path) == ("PUT", "/v1/sandboxes/sb1/files")
    assert c.params == [("path", "f"), ("parents", "true"), ("mode", "0640")]
    assert c.body is not None and c.body.headers["Content-Length"] == "2"
    assert got.mode == 0o640 and got.mtime.microsecond == 123456 and got.is_file


def test_make_dir_semantics() -> None:
    created = httpx.Response(201, json={"name": "d", "path": "/workspace/d", "type": "dir"})
    exists = ConflictError("exists", code="file_exists", status=409)
    missing_parent = NotFoundError("no parent", code="parent_not_found", status=404)
    assert _drive(_ops.make_dir("s", "d", True, 30), [created])[0] is True
    assert _drive(_ops.make_dir("s", "d", True, 30), [exists])[0] is False
    got, calls = _drive(_ops.make_dir("s", "a/b", True, 30), [missing_parent, created])
    assert got is True and calls[1].json == {"path": "a/b", "parents": True}
    with pytest.raises(NotFoundError):
        _drive(_ops.make_dir("s", "a/b", False, 30), [missing_parent])
    stopped = libdsec.SandboxNotRunningError("stopped", code="sandbox_not_running", status=409)
    with pytest.raises(libdsec.SandboxNotRunningError):
        _drive(_ops.make_dir("s", "d", True, 30), [stopped])
    with pytest.raises(libdsec.SandboxNotRunningError):
        _drive(_ops.kill_process("s", 1, "KILL", 30), [stopped])
    assert _drive(_ops.kill_process("s", 1, "KILL", 30), [NotFoundError("no pid", code="process_not_found")])[0] is False


def test_kill_and_pagination_ops() -> None:
    assert _drive(_ops.kill_sandbox("s", 30), [httpx.Response(204)])[0] is True
    assert _drive(_ops.kill_sandbox("s", 30), [NotFoundError("gone", status=404)])[0] is False
    sb = {"id": "x", "tier": "function", "image": "i", "state": "running",
          "created_at": "2026-01-01T00:00:00Z", "expires_at": "2026-01-01T00:05:00Z"}
    pages = [
        httpx.Response(200, json={"sandboxes": [sb, sb], "next_page_token": "p2"}),
        httpx.Response(200, json={"sandboxes": [sb]}),
    ]
    got, calls = _drive(_ops.list_sandboxes([("label", "a=b")], 30), pages)
    assert len(got) == 3 and calls[1].params == [("label", "a=b"), ("page_token", "p2")]
    loop = [httpx.Response(200, json={"sandboxes": [], "next_page_token": "same"})] * 3
    with pytest.raises(SandboxError):
        _drive(_ops.list_sandboxes([], 30), loop)


def test_connect_refuses_ended_sandbox() -> None:
    sb = {"id": "x", "tier": "function", "image": "i", "state": "stopped", "reason": "deleted",
          "created_at": "2026-01-01T00:00:00Z", "expires_at": "2026-01-01T00:05:00Z"}
    with pytest.raises(NotFoundError, match="stopped"):
        _drive(_ops.connect_sandbox("x", 30), [httpx.Response(200, json=sb)])


def test_stats_op_parses_full_and_sparse_bodies() -> None:
    full = {"memory_bytes": 5 << 20, "memory_peak_bytes": 9 << 20, "memory_limit_bytes": 128 << 20,
            "cpu_seconds": 1.25, "processes": 3, "disk_bytes": 2 << 20, "disk_limit_bytes": 64 << 20,
            "disk_full": True, "oom_kills": 2, "pids_limited": 7, "host_memory_bytes": 300 << 20}
    got, calls = _drive(_ops.sandbox_stats("sb/1", 30), [httpx.Response(200, json=full)])
    (c,) = calls
    assert (c.method, c.path, c.params, c.json) == ("GET", "/v1/sandboxes/sb%2F1/stats", [], None)
    assert got == libdsec.SandboxStats(
        memory_bytes=5 << 20, cpu_seconds=1.25, processes=3, disk_bytes=2 << 20, memory_peak_bytes=9 << 20,
        memory_limit_bytes=128 << 20, disk_limit_bytes=64 << 20, disk_full=True, oom_kills=2, pids_limited=7,
        host_memory_bytes=300 << 20,
    )
    assert isinstance(got.cpu_seconds, float) and isinstance(got.memory_bytes, int)
    # The server omits the optional fields when zero (omitempty).
    got, _ = _drive(_ops.sandbox_stats("s", 30),
                    [httpx.Response(200, json={"memory_bytes": 0, "cpu_seconds": 0, "processes": 0, "disk_bytes": 4096})])
    assert got == libdsec.SandboxStats(memory_bytes=0, cpu_seconds=0.0, processes=0, disk_bytes=4096)
    assert (got.memory_limit_bytes, got.disk_full, got.oom_kills, got.pids_limited) == (0, False, 0, 0)
    with pytest.raises(SandboxError) as e:
        _drive(_ops.sandbox_stats("s", 30), [httpx.Response(200, text="not json")])
    assert e.value.code == "invalid_response"
    stopped = libdsec.SandboxNotRunningError("stopped", code="sandbox_not_running", status=409)
    with pytest.raises(libdsec.SandboxNotRunningError):
        _drive(_ops.sandbox_stats("s", 30), [stopped])
    with pytest.raises(InvalidArgumentError):
        _drive(_ops.sandbox_stats("", 30), [])


INTEGRITY_JSON: dict[str, Any] = {
    "sandbox": "sb-1",
    "phases": [{"phase": "setup", "at": "2026-01-02T03:04:05.123456789Z"}, {"phase": "coding", "at": "2026-01-02T03:05:00Z"}],
    "events": 12,
    "denied": 2,
    "rules": [{"rule": "mount", "severity": "high", "count": 2, "first": "2026-01-02T03:04:06Z"}],
    "by_severity": {"high": 2},
    "sealed_grading": True,
    "grades": [{"at": "2026-01-02T03:06:00Z", "tests_layer": "tests/t:1", "verdict": "failed", "reason": "1 of 2 tests failed",
                "tests": 2, "passed": 1, "discarded": 3}],
    "suspicious": True,
    "monitored": True,
    "guest_enforced": [],
}

GRADE_JSON: dict[str, Any] = {
    "sandbox": "sb-1",
    "grader": "sb-2",
    "verdict": "failed",
    "reason": "1 of 2 tests failed",
    "declared_tests": 2,
    "audited": True,
    "grader_rules": [],
    "tests": 2,
    "passed": 1,
    "failed": 1,
    "errors": 0,
    "skipped": 0,
    "cases": [{"name": "test_a", "classname": "t", "status": "passed", "time_s": 0.25},
              {"name": "test_b", "status": "failed", "time_s": 0, "message": "assert 0 == 5"}],
    "exit_code": 1,
    "timed_out": False,
    "duration_ms": 812.5,
    "output": "1 failed, 1 passed",
    "carried": 4,
    "carried_bytes": 1234,
    "discarded": ["workspace/tests/test_a.py (tests layer)", "workspace/conftest.py (protected)"],
    "integrity": INTEGRITY_JSON,
    "at": "2026-01-02T03:06:00.5Z",
}


def _schema_properties(name: str) -> list[str]:
    """The properties of a schema of the repository's api/openapi.yaml
    (one per line, as that file writes them)."""
    from conftest import repo_root

    lines = (repo_root() / "api" / "openapi.yaml").read_text().splitlines()
    start = lines.index(f"    {name}:")
    props: list[str] = []
    inside = False
    for line in lines[start + 1:]:
        if line.startswith("    ") and not line.startswith("     "):
            break  # the next schema
        if line == "      properties:":
            inside = True
        elif inside and line.startswith("        ") and not line.startswith("         "):
            props.append(line.strip().split(":", 1)[0])
        elif inside and not line.startswith("        "):
            inside = False
    assert props, f"no properties for {name} in api/openapi.yaml"
    return props


@pytest.mark.parametrize("schema,cls", [
    ("GradeResult", libdsec.GradeResult), ("TestCase", libdsec.GradeCase), ("IntegrityReport", libdsec.IntegrityReport),
    ("GradeSummary", libdsec.GradeSummary), ("RuleCount", libdsec.RuleCount), ("PhaseChange", libdsec.PhaseChange),
    ("AuditEvent", libdsec.AuditEvent), ("SandboxStats", libdsec.SandboxStats), ("ExecResult", libdsec.CommandResult),
    ("Process", libdsec.ProcessInfo), ("FileInfo", libdsec.EntryInfo), ("Layer", libdsec.LayerInfo),
    ("Image", libdsec.ImageInfo), ("Sandbox", libdsec.SandboxInfo),
])
def test_models_have_every_wire_field(schema: str, cls: type) -> None:
    fields = {f.name for f in dataclasses.fields(cls)}
    assert set(_schema_properties(schema)) <= fields


def test_grade_result_parsing() -> None:
    got, calls = _drive(_ops.grade("sb-1", "tests/t:1", "pytest", request_timeout=30), [httpx.Response(200, json=GRADE_JSON)])
    assert calls[0].timeout == 300 + 120 + 30
    assert isinstance(got, libdsec.GradeResult)
    assert (got.sandbox, got.grader, got.verdict, got.reason) == ("sb-1", "sb-2", "failed", "1 of 2 tests failed")
    assert (got.tests, got.passed, got.failed, got.errors, got.skipped, got.declared_tests) == (2, 1, 1, 0, 0, 2)
    assert got.cases == [libdsec.GradeCase(name="test_a", classname="t", status="passed", time_s=0.25),
                         libdsec.GradeCase(name="test_b", status="failed", message="assert 0 == 5")]
    assert got.audited and got.grader_rules == [] and not got.timed_out
    assert (got.exit_code, got.duration_ms, got.output, got.carried, got.carried_bytes) == (1, 812.5, "1 failed, 1 passed", 4, 1234)
    assert got.discarded == GRADE_JSON["discarded"]
    assert got.at is not None and (got.at.microsecond, got.at.tzinfo is not None) == (500000, True)
    integ = got.integrity
    assert isinstance(integ, libdsec.IntegrityReport) and integ.sealed_grading and integ.suspicious
    assert [(p.phase, p.at.microsecond if p.at else None) for p in integ.phases] == [("setup", 123456), ("coding", 0)]
    assert integ.rules[0].rule == "mount" and integ.rules[0].count == 2 and integ.rules[0].first is not None
    assert integ.by_severity == {"high": 2} and integ.guest_enforced == []
    (g,) = integ.grades
    assert (g.tests_layer, g.verdict, g.reason, g.tests, g.passed, g.discarded) == ("tests/t:1", "failed", "1 of 2 tests failed", 2, 1, 3)
    # Code written when grade() returned the JSON's dict keeps working.
    assert got["verdict"] == "failed" and got["cases"][1]["name"] == "test_b"
    assert got["integrity"]["grades"][-1]["verdict"] == "failed" and integ["events"] == 12
    assert got.raw == GRADE_JSON
    with pytest.raises(KeyError):
        got["no_such_field"]


def test_integrity_parsing_of_sparse_bodies() -> None:
    got, calls = _drive(_ops.integrity("sb/1", 30), [httpx.Response(200, json=INTEGRITY_JSON)])
    assert calls[0].path == "/v1/sandboxes/sb%2F1/integrity"
    assert isinstance(got, libdsec.IntegrityReport) and got.events == 12 and got.denied == 2 and got.monitored
    # Go writes a nil list as null; a field this SDK does not know stays in raw.
    body = {"sandbox": "sb-1", "phases": None, "rules": None, "by_severity": None, "grades": None,
            "guest_enforced": ["writable", "user"], "newer_field": 1}
    got, _ = _drive(_ops.integrity("sb-1", 30), [httpx.Response(200, json=body)])
    assert got == libdsec.IntegrityReport(sandbox="sb-1", guest_enforced=["writable", "user"])
    assert got.raw["newer_field"] == 1
    got, _ = _drive(_ops.grade("sb-1", "t:1", "x", request_timeout=30),
                    [httpx.Response(200, json={"sandbox": "sb-1", "grader": "g", "verdict": "error", "cases": None,
                                               "grader_rules": None, "discarded": None, "integrity": None})])
    assert got.cases == [] and got.discarded == [] and got.integrity == libdsec.IntegrityReport(sandbox="")


def test_body_from_file_is_streamed_and_rewindable() -> None:
    f = io.BytesIO(b"x" * 3_000_000)
    f.seek(100)
    b = Body(f)
    assert b.length == 2_999_900 and b.headers["Content-Length"] == "2999900"
    content = b.sync_content()
    assert not isinstance(content, bytes)
    chunks = list(content)
    assert len(chunks) == 3 and sum(len(c) for c in chunks) == 2_999_900
    assert b.rewind() and f.tell() == 100

    class Pipe:
        def __init__(self) -> None:
            self.parts = [b"a", b"b"]

        def read(self, n: int) -> bytes:
            return self.parts.pop(0) if self.parts else b""

    p = Body(Pipe())
    assert p.length is None and "Content-Length" not in p.headers
    assert list(p.sync_content()) == [b"a", b"b"]
    assert not p.rewind()
    t = Body(io.StringIO("héllo"))
    assert b"".join(t.sync_content()) == "héllo".encode()  # type: ignore[arg-type]


# --------------------------------------------------------- exec stream parsing


def test_exec_stream_parser() -> None:
    events = [
        {"type": "start", "pid": 7},
        {"type": "stdout", "data": "hel"},
        {"type": "stderr", "data": "warn\n"},
        {"type": "stdout", "data": "lo\n"},
        {"type": "exit", "result": {"exit_code": 0, "stdout": "", "stderr": "", "duration_ms": 3.5, "stdout_truncated": True}},
    ]
    raw = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    p = _ops.ExecStream()
    got = []
    for i in range(0, len(raw), 7):  # arbitrary chunk boundaries
        got.extend(p.feed(raw[i : i + 7]))
    assert got == [("stdout", "hel"), ("stderr", "warn\n"), ("stdout", "lo\n")]
    r = p.finish()
    assert (r.stdout, r.stderr, r.exit_code, r.duration_ms, r.stdout_truncated, p.pid) == ("hello\n", "warn\n", 0, 3.5, True, 7)

    err = _ops.ExecStream()
    with pytest.raises(UnsupportedError, match="function"):
        err.feed(b'{"type":"error","error":{"code":"no_shell","message":"the function tier has no shell","class":"unsupported"}}\n')

    cut = _ops.ExecStream()
    cut.feed(b'{"type":"stdout","data":"x"}\n')
    with pytest.raises(ConnectionError):
        cut.finish()
    # The last line may lack its newline.
    last = _ops.ExecStream()
    last.feed(b'{"type":"exit","result":{"exit_code":2,"stdout":"","stderr":"","duration_ms":1}}')
    assert last.finish().exit_code == 2


# ------------------------------------------------------------- retry policy


def _opts(**kw: Any) -> ClientOptions:
    return ClientOptions(url="http://x", token="t", **kw)


def test_retry_policy() -> None:
    o = _opts(max_retries=2)
    post = Call("POST", "/v1/sandboxes", 30)
    get = Call("GET", "/v1/sandboxes", 30)
    rl = RateLimitError("slow", status=429, retry_after=1.0)
    d = error_retry_delay(o, post, rl, 0)
    assert d is not None and 1.0 <= d <= 1.25
    assert error_retry_delay(o, post, rl, 2) is None  # out of attempts
    assert error_retry_delay(o, post, RateLimitError("x", retry_after=3600), 0) is None  # too long to wait
    assert error_retry_delay(o, get, NotFoundError("x", status=404), 0) is None
    assert error_retry_delay(o, get, ServerError("x", status=500), 0) is None
    assert error_retry_delay(o, post, ServerError("x", status=503, retry_after=0.5), 0) is not None
    # A quota waits for the caller's deletes, not for time.
    assert error_retry_delay(o, post, RateLimitError("x", code="too_many_sandboxes", retry_after=1.0), 0) is None
    # 503 without Retry-After: only what is safe to repeat.
    gone = ServerError("agent gone", code="agent_gone", status=503)
    assert error_retry_delay(o, post, gone, 0) is None
    assert error_retry_delay(o, get, gone, 0) is not None
    req = httpx.Request("GET", "http://x")
    broken = httpx.RemoteProtocolError("server disconnected", request=req)
    assert transport_retry_delay(o, get, broken, 0) is not None
    assert transport_retry_delay(o, Call("DELETE", "/v1/sandboxes/x", 30), broken, 0) is not None
    assert transport_retry_delay(o, post, broken, 0) is None  # may have run: never resent
    assert transport_retry_delay(o, post, httpx.ConnectError("refused", request=req), 0) is not None
    assert transport_retry_delay(o, get, httpx.ReadTimeout("slow", request=req), 0) is None


def test_retry_backoff_and_budget() -> None:
    o = _opts(max_retries=50, backoff_base=0.2, backoff_max=10.0, retry_timeout=30.0)
    post = Call("POST", "/v1/sandboxes", 30)
    overloaded = RateLimitError("busy", code="overloaded", status=429, retry_after=1.0)
    for _ in range(200):
        # Retry-After is a floor; later attempts back off exponentially past it.
        d0 = error_retry_delay(o, post, overloaded, 0)
        assert d0 is not None and 1.0 <= d0 <= 1.25
        d5 = error_retry_delay(o, post, overloaded, 5)
        assert d5 is not None and 6.4 <= d5 <= 8.0
        d9 = error_retry_delay(o, post, overloaded, 9)
        assert d9 is not None and 10.0 <= d9 <= 12.5
    # Spread out: a thousand clients told "1 s" do not return together.
    assert len({round(error_retry_delay(o, post, overloaded, 0) or 0, 3) for _ in range(100)}) > 50
    # No retry starts past the budget.
    assert error_retry_delay(o, post, overloaded, 1, elapsed=29.5) is None
    assert error_retry_delay(o, post, overloaded, 1, elapsed=5.0) is not None
    assert error_retry_delay(_opts(retry_timeout=None), post, overloaded, 1, elapsed=1e6) is not None
    req = httpx.Request("POST", "http://x")
    assert transport_retry_delay(o, post, httpx.ConnectError("refused", request=req), 0, elapsed=31.0) is None


def _mock_client(handler: Any, **options: Any) -> libdsec.Client:
    c = libdsec.Client("http://dsec.invalid", "tok", backoff_base=0.001, **options)
    c._http.close()
    c._http = httpx.Client(transport=httpx.MockTransport(handler), **c._client_kwargs())
    return c


SANDBOX_JSON = {"id": "sb-1", "tier": "function", "image": "default", "state": "running",
                "created_at": "2026-01-01T00:00:00Z", "expires_at": "2026-01-01T00:05:00Z"}


def test_client_retries_429_and_sends_headers() -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        if len(seen) < 3:
            return httpx.Response(429, json={"code": "rate_limited", "message": "wait", "class": "rate_limited"},
                                  headers={"Retry-After": "0"})
        return httpx.Response(201, json=SANDBOX_JSON)

    c = _mock_client(handler)
    sb = libdsec.Sandbox.create(tier="function", metadata={"k": "v"}, client=c)
    assert sb.sandbox_id == "sb-1" and sb.tier == "function" and len(seen) == 3
    r = seen[-1]
    assert r.headers["authorization"] == "Bearer tok"
    assert r.headers["user-agent"] == f"libdsec/{libdsec.__version__}"
    assert json.loads(r.content) == {"tier": "function", "timeout_s": 300, "labels": {"k": "v"}}


def test_client_gives_up_after_max_retries() -> None:
    n = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal n
        n += 1
        return httpx.Response(429, json={"code": "rate_limited", "message": "wait"}, headers={"Retry-After": "0"})

    c = _mock_client(handler, max_retries=2)
    with pytest.raises(RateLimitError) as ei:
        libdsec.Sandbox.kill_by_id("sb-1", client=c)
    assert n == 3 and ei.value.retry_after == 0


def test_client_retries_connection_errors_only_when_safe() -> None:
    calls: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.method)
        if len(calls) == 1:
            raise httpx.RemoteProtocolError("server disconnected", request=req)
        if req.method == "GET":
            return httpx.Response(200, json=SANDBOX_JSON)
        raise httpx.RemoteProtocolError("server disconnected", request=req)

    c = _mock_client(handler)
    sb = libdsec.Sandbox.connect("sb-1", client=c)  # GET: retried
    assert calls == ["GET", "GET"]
    with pytest.raises(ConnectionError):
        sb.commands.run(["echo"])  # POST: not retried
    assert calls == ["GET", "GET", "POST"]


def test_refused_upload_reports_the_cause() -> None:
    # httpx cannot read a response once writing the body fails, as it does
    # when the server refuses a large upload early; the SDK then asks again.
    def handler(req: httpx.Request) -> httpx.Response:
        if req.method == "PUT":
            raise httpx.WriteError("[Errno 32] Broken pipe", request=req)
        assert req.url.path == "/v1/sandboxes/sb-1/files/exists" and req.url.params["path"] == "/etc/x"
        return httpx.Response(400, json={"code": "path_outside_root", "message": "outside", "class": "invalid_argument"})

    c = _mock_client(handler)
    files = libdsec.Files(c, "sb-1", 30)
    with pytest.raises(InvalidArgumentError) as ei:
        files.write("/etc/x", io.BytesIO(b"x" * 1000))
    assert ei.value.code == "path_outside_root"

    def ok_handler(req: httpx.Request) -> httpx.Response:
        if req.method == "PUT":
            raise httpx.WriteError("[Errno 32] Broken pipe", request=req)
        return httpx.Response(200, json={"exists": False})

    files = libdsec.Files(_mock_client(ok_handler), "sb-1", 30)
    with pytest.raises(ConnectionError) as ce:
        files.write("/etc/x", b"data")
    assert ce.value.code == "write_failed" and "refused" in str(ce.value)


def test_async_client_on_mock_transport() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path.endswith("/exec/stream"):
            lines = [
                {"type": "start"},
                {"type": "stdout", "data": "a\n"},
                {"type": "stdout", "data": "b\n"},
                {"type": "exit", "result": {"exit_code": 0, "stdout": "", "stderr": "", "duration_ms": 1}},
            ]
            return httpx.Response(200, content=b"".join(json.dumps(x).encode() + b"\n" for x in lines))
        if req.url.path.endswith("/exec"):
            return httpx.Response(200, json={"exit_code": 0, "stdout": "hi\n", "stderr": "", "duration_ms": 1})
        return httpx.Response(200, json=SANDBOX_JSON)

    async def main() -> None:
        c = libdsec.AsyncClient("http://dsec.invalid", "tok")
        await c._http.aclose()
        c._http = httpx.AsyncClient(transport=httpx.MockTransport(handler), **c._client_kwargs())
        async with c:
            sb = await libdsec.AsyncSandbox.connect("sb-1", client=c)
            assert (await sb.commands.run("echo hi")).stdout == "hi\n"
            chunks: list[str] = []

            async def on_out(s: str) -> None:
                chunks.append(s)

            r = await sb.commands.run(["x"], on_stdout=on_out)
            assert chunks == ["a\n", "b\n"] and r.stdout == "a\nb\n"

    asyncio.run(main())


def test_sandbox_stats_on_mock_transport() -> None:
    stats = {"memory_bytes": 1 << 20, "cpu_seconds": 0.5, "processes": 2, "disk_bytes": 8192, "oom_kills": 1}
    paths: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        paths.append(f"{req.method} {req.url.path}")
        if req.url.path.endswith("/stats"):
            return httpx.Response(200, json=stats)
        return httpx.Response(200, json=SANDBOX_JSON)

    want = libdsec.SandboxStats(memory_bytes=1 << 20, cpu_seconds=0.5, processes=2, disk_bytes=8192, oom_kills=1)
    sb = libdsec.Sandbox.connect("sb-1", client=_mock_client(handler))
    assert sb.stats() == want

    async def main() -> libdsec.SandboxStats:
        c = libdsec.AsyncClient("http://dsec.invalid", "tok")
        await c._http.aclose()
        c._http = httpx.AsyncClient(transport=httpx.MockTransport(handler), **c._client_kwargs())
        async with c:
            asb = await libdsec.AsyncSandbox.connect("sb-1", client=c)
            return await asb.stats()

    assert asyncio.run(main()) == want
    assert paths == ["GET /v1/sandboxes/sb-1", "GET /v1/sandboxes/sb-1/stats"] * 2


def test_shared_clients() -> None:
    a = libdsec.Client.shared("http://dsec.invalid", "t1")
    assert libdsec.Client.shared("http://dsec.invalid/", "t1") is a
    assert libdsec.Client.shared("http://dsec.invalid", "t2") is not a
    libdsec.Client.close_shared()
    assert a.closed and libdsec.Client.shared("http://dsec.invalid", "t1") is not a
    libdsec.Client.close_shared()

    async def per_loop() -> libdsec.AsyncClient:
        c = libdsec.AsyncClient.shared("http://dsec.invalid", "t1")
        assert libdsec.AsyncClient.shared("http://dsec.invalid", "t1") is c
        assert c.options.max_connections == 1000
        await libdsec.AsyncClient.aclose_shared()
        assert c.closed
        return c

    assert asyncio.run(per_loop()) is not asyncio.run(per_loop())


def test_sync_client_sets_tcp_nodelay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync client's connections send at once (TCP_NODELAY): with
    Nagle on, a request's body waited for the server's delayed ACK of its
    headers, 40 ms a call."""
    import http.server
    import socket
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep the connection open

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    made: list[socket.socket] = []
    real = socket.create_connection

    def spy(*args: Any, **kwargs: Any) -> socket.socket:
        s = real(*args, **kwargs)
        made.append(s)
        return s

    monkeypatch.setattr(socket, "create_connection", spy)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with libdsec.Client(url, token="t") as c:
            c._http.post("/x", json={"a": 1})
            assert made and made[-1].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        # Negative control: httpx's own sync client leaves Nagle on.
        with httpx.Client(base_url=url) as plain:
            plain.post("/x", json={"a": 1})
            assert made[-1].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
    finally:
        server.shutdown()
        server.server_close()


def _http_server(status: int, body: bytes) -> Any:
    """A real HTTP server answering every request with status and body;
    it counts the requests it got (server.hits)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            self.server.hits += 1  # type: ignore[attr-defined]
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.hits = 0  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _dead_url() -> str:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def test_failover_between_servers() -> None:
    """With several URLs, a call the first server cannot take (it refuses
    connections, or answers 503) is retried on the next, where the client
    stays; a 429 stays on the same server. Sync and async alike."""
    sandbox = json.dumps({"id": "sb-1", "tier": "function", "state": "running"}).encode()
    good = _http_server(200, sandbox)
    busy = _http_server(503, json.dumps({"code": "draining", "message": "going away", "class": "unavailable"}).encode())
    limited = _http_server(429, json.dumps({"code": "rate_limited", "message": "slow", "class": "rate_limited"}).encode())
    good_url = f"http://127.0.0.1:{good.server_address[1]}"
    busy_url = f"http://127.0.0.1:{busy.server_address[1]}"
    limited_url = f"http://127.0.0.1:{limited.server_address[1]}"
    try:
        with libdsec.Client(f"{_dead_url()}, {good_url}", token="t", backoff_base=0.01) as c:
            assert c.run(_ops.get_sandbox("sb-1", 5.0)).sandbox_id == "sb-1"
            assert good.hits == 1 and c._urls[c._server] == good_url
        with libdsec.Client(f"{busy_url},{good_url}", token="t", backoff_base=0.01) as c:
            assert c.run(_ops.get_sandbox("sb-1", 5.0)).sandbox_id == "sb-1"
            assert busy.hits == 1 and good.hits == 2

        async def async_failover() -> None:
            async with libdsec.AsyncClient(f"{_dead_url()},{good_url}", token="t", backoff_base=0.01) as ac:
                assert (await ac.run(_ops.get_sandbox("sb-1", 5.0))).sandbox_id == "sb-1"

        asyncio.run(async_failover())
        assert good.hits == 3
        with libdsec.Client(f"{limited_url},{good_url}", token="t", backoff_base=0.01, max_retries=2) as c:
            with pytest.raises(RateLimitError):
                c.run(_ops.get_sandbox("sb-1", 5.0))
            assert limited.hits == 3 and good.hits == 3
        with pytest.raises(InvalidArgumentError):
            libdsec.Client(f"{good_url},ftp://x", token="t")
    finally:
        for s in (good, busy, limited):
            s.shutdown()
            s.server_close()


def test_keyed_create_retried_after_lost_answer() -> None:
    """A create whose answer is lost (the server reads it and drops the
    connection) is sent again when it carries a request_id, and not when
    it does not (it may have made a sandbox)."""
    import http.server
    import threading

    sandbox = json.dumps({"id": "sb-1", "tier": "function", "state": "running"}).encode()
    bodies: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            if len(bodies) % 2 == 1:
                self.close_connection = True
                self.connection.shutdown(2)  # the answer is lost
                return
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(sandbox)))
            self.end_headers()
            self.wfile.write(sandbox)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with libdsec.Client(url, token="t", backoff_base=0.01) as c:
            with pytest.raises(ConnectionError):
                c.run(_ops.create_sandbox(_ops.create_body(tier=None, image=None, timeout=None, cpu=None,
                                                           memory_mb=None, disk_mb=None, envs=None, metadata=None, labels=None), 5.0))
            assert len(bodies) == 1
            bodies.clear()
            body = _ops.create_body(tier=None, image=None, timeout=None, cpu=None, memory_mb=None, disk_mb=None,
                                    envs=None, metadata=None, labels=None, request_id="r-1")
            assert c.run(_ops.create_sandbox(body, 5.0)).sandbox_id == "sb-1"
            assert len(bodies) == 2 and all(b["request_id"] == "r-1" for b in bodies)
    finally:
        server.shutdown()
        server.server_close()
