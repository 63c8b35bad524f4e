"""Unit tests of trajectories, snapshots, fork and resume that need no
server: request building, path escaping, paging, export, parsing and the
new error codes (on httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import io
import json
import os
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

import libdsec
from libdsec import _ops
from libdsec.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    ReplayDivergedError,
    SandboxError,
    ServerError,
    TrajectoryInFlightError,
    error_from_response,
)

TRAJ = "run-42/task-7/rollout-3"
ESC = "/v1/trajectories/run-42%2Ftask-7%2Frollout-3"

SANDBOX_JSON: dict[str, Any] = {"id": "sb-1", "tier": "container", "image": "debian-12", "state": "running",
                "created_at": "2026-01-01T00:00:00Z", "expires_at": "2026-01-01T00:05:00Z",
                "trajectory": TRAJ, "incarnation": 1}
SNAP_JSON: dict[str, Any] = {"id": "snap-1", "sandbox": "sb-1", "trajectory": TRAJ, "step": 4, "tier": "container",
             "layers": ["sha256:l1"], "bytes": 4096, "created_at": "2026-01-01T00:01:00Z"}

Handler = Callable[[httpx.Request], httpx.Response]


def _client(handler: Handler, **options: Any) -> libdsec.Client:
    c = libdsec.Client("http://dsec.invalid", "tok", backoff_base=0.001, **options)
    c._http.close()
    c._http = httpx.Client(transport=httpx.MockTransport(handler), **c._client_kwargs())
    return c


def _async_client(handler: Handler) -> libdsec.AsyncClient:
    c = libdsec.AsyncClient("http://dsec.invalid", "tok", backoff_base=0.001)
    c._http = httpx.AsyncClient(transport=httpx.MockTransport(handler), **c._client_kwargs())
    return c


def _path(req: httpx.Request) -> str:
    return req.url.raw_path.decode().split("?")[0]


def _step(n: int, **kw: Any) -> dict[str, Any]:
    return {"trajectory": TRAJ, "step": n, "kind": "exec", "at": "2026-01-01T00:00:01Z", "sandbox": "sb-1", **kw}


# ---------------------------------------------------------------- create


def _create(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(tier=None, image=None, timeout=None, cpu=None, memory_mb=None, disk_mb=None,
                                envs=None, metadata=None, labels=None)
    base.update(kw)
    return _ops.create_body(**base)


def test_create_body_trajectory_fields() -> None:
    body = _create(tier="container", envs={"A": "1", "TOKEN": "t"}, trajectory=TRAJ, record=True,
                   secret_env=["TOKEN"], resume_on_preempt=True)
    assert body == {"tier": "container", "env": {"A": "1", "TOKEN": "t"}, "secret_env": ["TOKEN"],
                    "trajectory": TRAJ, "record": True, "resume_on_preempt": True}
    # A mapping of secret values is merged into env, over it.
    body = _create(envs={"A": "1", "K": "old"}, secret_env={"K": "s3cret", "L": "x"})
    assert body["env"] == {"A": "1", "K": "s3cret", "L": "x"} and body["secret_env"] == ["K", "L"]
    # Nothing is sent that was not asked for.
    assert _create() == {}
    assert _create(from_snapshot="snap-1") == {"from_snapshot": "snap-1"}


@pytest.mark.parametrize("kw,msg", [
    ({"secret_env": ["NOPE"]}, "which envs lacks"),
    ({"secret_env": "TOKEN"}, "list of strings"),
    ({"secret_env": {"K": 1}}, "map strings to strings"),
    ({"from_snapshot": "s", "image": "debian-12"}, "not both"),
    ({"from_snapshot": ""}, "snapshot's ID"),
    ({"trajectory": ""}, "non-empty"),
])
def test_create_body_refuses(kw: dict[str, Any], msg: str) -> None:
    with pytest.raises(InvalidArgumentError, match=msg):
        _create(**kw)


def test_create_sends_no_tier_by_default() -> None:
    sent: list[dict[str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        sent.append(json.loads(req.content))
        return httpx.Response(201, json=SANDBOX_JSON)

    sb = libdsec.Sandbox.create(from_snapshot="snap-1", timeout=None, client=_client(handler))
    assert sent == [{"from_snapshot": "snap-1"}]
    assert (sb.trajectory, sb.incarnation, sb.divergence, sb.resume_result) == (TRAJ, 1, None, None)


# ----------------------------------------------------------------- paths


def test_trajectory_paths_are_one_segment() -> None:
    seen: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(f"{req.method} {req.url.raw_path.decode()}")
        p = _path(req)
        if req.method == "DELETE":
            return httpx.Response(204)
        if p.endswith("/steps"):
            return httpx.Response(200, json={"trajectory": {"id": TRAJ}, "steps": []})
        if "/blobs/" in p:
            return httpx.Response(200, content=b"blob")
        if p.endswith("/resume"):
            return httpx.Response(201, json={"sandbox": SANDBOX_JSON, "replayed": 1, "skipped": 0, "duration_ms": 3})
        if p.startswith("/v1/snapshots/"):
            return httpx.Response(200, json=SNAP_JSON)
        return httpx.Response(200, json={"id": TRAJ, "state": "ended"})

    c = _client(handler)
    assert c.trajectories.get(TRAJ).id == TRAJ
    assert list(c.trajectories.steps(TRAJ)) == []
    assert c.trajectories.blob(TRAJ, "sha256:ab") == b"blob"
    libdsec.Sandbox.resume(TRAJ, client=c)
    assert c.trajectories.delete(TRAJ) is True
    assert c.snapshots.get("snap/1").id == "snap-1"
    assert seen == [
        f"GET {ESC}",
        f"GET {ESC}/steps?limit={_ops.STEPS_PAGE}",
        f"GET {ESC}/blobs/sha256:ab",
        f"POST {ESC}/resume",
        f"DELETE {ESC}",
        "GET /v1/snapshots/snap%2F1",
    ]


def test_bad_ids_send_nothing() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise AssertionError(f"unexpected request {req.url}")

    c = _client(handler)
    with pytest.raises(InvalidArgumentError):
        c.trajectories.get("")
    with pytest.raises(InvalidArgumentError):
        c.trajectories.blob(TRAJ, "")
    with pytest.raises(InvalidArgumentError):
        c.snapshots.get("")
    with pytest.raises(InvalidArgumentError):
        libdsec.Sandbox(libdsec.SandboxInfo.from_json(SANDBOX_JSON), client=c).fork(count=True)


# ----------------------------------------------------------------- steps


def _paged(steps: list[dict[str, Any]], per: int) -> Handler:
    def handler(req: httpx.Request) -> httpx.Response:
        after = int(req.url.params.get("after", "0"))
        page = [s for s in steps if s["step"] > after][:per]
        body: dict[str, Any] = {"trajectory": {"id": TRAJ}, "steps": page}
        if page and page[-1]["step"] < steps[-1]["step"]:
            body["next_page_token"] = str(page[-1]["step"])
        return httpx.Response(200, json=body)
    return handler


def test_steps_follow_every_page() -> None:
    steps = [_step(n, exec={"request": {"cmd": ["echo", str(n)]}, "exit_code": 0, "output_digest": f"sha256:{n}"})
             for n in range(1, 8)]
    c = _client(_paged(steps, 3))
    got = list(c.trajectories.steps(TRAJ))
    assert [s.step for s in got] == list(range(1, 8))
    assert got[0].exec is not None and got[0].exec.cmd == ["echo", "1"]
    assert [s.step for s in c.trajectories.steps(TRAJ, after=5)] == [6, 7]


def test_steps_refuse_a_token_that_does_not_move() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"steps": [_step(3)], "next_page_token": "3"})

    with pytest.raises(SandboxError) as ei:
        list(_client(handler).trajectories.steps(TRAJ, after=3))
    assert ei.value.code == "invalid_response"


# ---------------------------------------------------------------- export


def _export_handler(lines: list[dict[str, Any]]) -> Handler:
    def handler(req: httpx.Request) -> httpx.Response:
        if "none" in req.url.raw_path.decode():
            return httpx.Response(404, json={"code": "trajectory_not_found", "message": "no", "class": "not_found"})
        assert req.headers["accept"] == "application/x-ndjson"
        body = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
        return httpx.Response(200, content=body, headers={"Content-Type": "application/x-ndjson"})
    return handler


def test_export_to_a_path_and_a_file(tmp_path: Path) -> None:
    lines = [_step(1, kind="create", create={"request": {"tier": "container"}, "secret_env": ["K"]}), _step(2, pure=True)]
    c = _client(_export_handler(lines))
    out = tmp_path / "t.jsonl"
    out.write_text("old")
    assert c.trajectories.export(TRAJ, out) == 2
    got = [libdsec.TrajectoryStep.from_json(json.loads(x)) for x in out.read_text().splitlines()]
    assert [s.step for s in got] == [1, 2] and got[1].pure
    assert got[0].create is not None and got[0].create.secret_env == ["K"]
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    buf = io.BytesIO()
    assert c.trajectories.export(TRAJ, buf) == 2
    assert buf.getvalue() == out.read_bytes()

    # A failed export leaves the old file and no temporary one.
    with pytest.raises(NotFoundError) as ei:
        c.trajectories.export("none", out)
    assert ei.value.code == "trajectory_not_found"
    assert sorted(os.listdir(tmp_path)) == ["t.jsonl"] and out.read_bytes() == buf.getvalue()


# ---------------------------------------------------------- resume, fork


def test_resume() -> None:
    sent: list[dict[str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        sent.append(json.loads(req.content))
        return httpx.Response(201, json={
            "sandbox": {**SANDBOX_JSON, "id": "sb-2", "incarnation": 2,
                        "divergence": {"step": 5, "kind": "exec", "logged": "exit 0", "replayed": "exit 1"}},
            "replayed": 7, "skipped": 3, "from_snapshot": "snap-1", "duration_ms": 812.5,
            "divergence": {"step": 5, "kind": "exec", "logged": "exit 0", "replayed": "exit 1"},
        })

    sb = libdsec.Sandbox.resume(TRAJ, secret_env={"K": "v"}, on_divergence="continue", tier="function",
                                from_scratch=True, timeout=60, client=_client(handler))
    assert sent == [{"secret_env": {"K": "v"}, "on_divergence": "continue", "tier": "function",
                     "from_scratch": True, "timeout_s": 60}]
    r = sb.resume_result
    assert r is not None and (r.replayed, r.skipped, r.from_snapshot, r.duration_ms) == (7, 3, "snap-1", 812.5)
    assert r.divergence is not None and (r.divergence.step, r.divergence.replayed) == (5, "exit 1")
    assert r["replayed"] == 7  # raw
    assert (sb.sandbox_id, sb.incarnation, sb.trajectory) == ("sb-2", 2, TRAJ)
    assert sb.divergence is not None and sb.divergence.step == 5


def test_fork_and_snapshot() -> None:
    sent: list[tuple[str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        sent.append((_path(req), json.loads(req.content) if req.content else None))
        if _path(req).endswith("/snapshot"):
            return httpx.Response(201, json=SNAP_JSON)
        kids = [{**SANDBOX_JSON, "id": f"sb-c{i}", "trajectory": f"{TRAJ}/fork-4-{i}"} for i in range(3)]
        return httpx.Response(201, json={"snapshot": SNAP_JSON, "sandboxes": kids})

    parent = libdsec.Sandbox(libdsec.SandboxInfo.from_json(SANDBOX_JSON), client=_client(handler))
    snap = parent.snapshot()
    assert (snap.id, snap.step, snap.layers, snap.bytes) == ("snap-1", 4, ["sha256:l1"], 4096)
    kids = parent.fork(count=3, timeout=60, labels={"g": "1"})
    assert [k.sandbox_id for k in kids] == ["sb-c0", "sb-c1", "sb-c2"]
    assert all(isinstance(k, libdsec.Sandbox) for k in kids) and kids.snapshot.id == "snap-1"
    assert kids[1].trajectory == f"{TRAJ}/fork-4-1"
    assert sent == [("/v1/sandboxes/sb-1/snapshot", None),
                    ("/v1/sandboxes/sb-1/fork", {"count": 3, "timeout_s": 60, "labels": {"g": "1"}})]


# ---------------------------------------------------------- error codes


@pytest.mark.parametrize("status,code,class_,exc", [
    (404, "trajectory_not_found", "not_found", NotFoundError),
    (404, "snapshot_not_found", "not_found", NotFoundError),
    (409, "trajectory_running", "conflict", ConflictError),
    (409, "replay_diverged", "conflict", ReplayDivergedError),
    (400, "invalid_fork_count", "invalid_argument", InvalidArgumentError),
    (400, "secret_env_missing", "invalid_argument", InvalidArgumentError),
    (503, "trajectory_in_flight", "unavailable", TrajectoryInFlightError),
])
def test_trajectory_error_codes(status: int, code: str, class_: str, exc: type[SandboxError]) -> None:
    e = error_from_response(httpx.Response(status, json={"code": code, "message": "m", "class": class_},
                                           headers={"Retry-After": "2"}))
    assert type(e) is exc and e.code == code
    if isinstance(e, ServerError):
        assert e.retry_after == 2.0
    assert issubclass(ReplayDivergedError, ConflictError) and issubclass(TrajectoryInFlightError, ServerError)


def test_trajectory_in_flight_is_retried() -> None:
    calls: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.method)
        if len(calls) == 1:
            return httpx.Response(503, json={"code": "trajectory_in_flight", "message": "resuming", "class": "unavailable"},
                                  headers={"Retry-After": "0"})
        return httpx.Response(200, json={"stdout": "ok\n", "stderr": "", "exit_code": 0})

    sb = libdsec.Sandbox(libdsec.SandboxInfo.from_json(SANDBOX_JSON), client=_client(handler))
    assert sb.commands.run(["echo", "ok"]).stdout == "ok\n" and calls == ["POST", "POST"]

    # Without Retry-After a POST may have done something: not resent.
    def no_hint(req: httpx.Request) -> httpx.Response:
        calls.append(req.method)
        return httpx.Response(503, json={"code": "trajectory_in_flight", "message": "lost", "class": "unavailable"})

    calls.clear()
    sb = libdsec.Sandbox(libdsec.SandboxInfo.from_json(SANDBOX_JSON), client=_client(no_hint))
    with pytest.raises(TrajectoryInFlightError):
        sb.commands.run(["echo", "ok"])
    assert calls == ["POST"]


# ---------------------------------------------------------------- models


def test_step_parsing() -> None:
    s = libdsec.TrajectoryStep.from_json(_step(
        4, kind="write", duration_ms=2.5, file={"path": "/workspace/a", "digest": "sha256:d", "size": 3},
        audit=[{"sandbox": "sb-1", "time": "2026-01-01T00:00:01Z", "kind": "exec", "verdict": "allowed",
                "severity": "info", "path": "/bin/sh"}],
        labels={"k": "v"}, future_field=1))
    assert s.kind == libdsec.StepKind.WRITE and s.file is not None and s.file.digest == "sha256:d"
    assert s.exec is None and s.audit[0].path == "/bin/sh" and s.labels == {"k": "v"}
    assert s["future_field"] == 1
    assert libdsec.TrajectoryStep.from_json(_step(5, kind="phase", phase={"phase": "testing"})).phase == "testing"
    assert libdsec.TrajectoryStep.from_json(_step(6, kind="end", end={"reason": "deleted"})).end_reason == "deleted"
    r = libdsec.TrajectoryStep.from_json(_step(7, kind="resume", resume={"replayed": 2, "skipped": 1, "reason": "preempted"}))
    assert r.resume is not None and (r.resume.replayed, r.resume.reason) == (2, "preempted")
    e = libdsec.StepExec.from_json({"request": {"command": "make test"}, "exit_code": 2, "output_digest": "sha256:o"})
    assert e.cmd == "make test" and e.exit_code == 2
    t = libdsec.Trajectory.from_json({"id": TRAJ, "state": "diverged", "steps": 9, "incarnations": 2,
                                      "snapshots": [SNAP_JSON], "parent": "run-42", "parent_step": 3,
                                      "divergence": {"step": 9, "kind": "exec", "logged": "a", "replayed": "b"}})
    assert t.snapshots[0].id == "snap-1" and t.divergence is not None and t.divergence.step == 9 and t.parent_step == 3


# ----------------------------------------------------------------- async


def test_async_trajectories(tmp_path: Path) -> None:
    steps = [_step(n) for n in range(1, 6)]
    paged = _paged(steps, 2)
    export = _export_handler(steps)

    def handler(req: httpx.Request) -> httpx.Response:
        p = _path(req)
        if p.endswith("/steps"):
            return paged(req)
        if p.endswith("/export"):
            return export(req)
        if p.endswith("/resume"):
            return httpx.Response(201, json={"sandbox": SANDBOX_JSON, "replayed": 4, "skipped": 1, "duration_ms": 1})
        if p.endswith("/fork"):
            return httpx.Response(201, json={"snapshot": SNAP_JSON, "sandboxes": [SANDBOX_JSON, SANDBOX_JSON]})
        if req.method == "DELETE":
            return httpx.Response(404, json={"code": "snapshot_not_found", "message": "no", "class": "not_found"})
        raise AssertionError(f"unexpected {req.method} {p}")

    async def main() -> None:
        c = _async_client(handler)
        try:
            got = [s.step async for s in c.trajectories.steps(TRAJ)]
            assert got == [1, 2, 3, 4, 5]
            assert await c.trajectories.export(TRAJ, tmp_path / "a.jsonl") == 5
            sb = await libdsec.AsyncSandbox.resume(TRAJ, client=c)
            assert sb.resume_result is not None and sb.resume_result.replayed == 4
            kids = await sb.fork(2)
            assert len(kids) == 2 and isinstance(kids[0], libdsec.AsyncSandbox) and kids.snapshot.id == "snap-1"
            assert await c.snapshots.delete("snap-9") is False
        finally:
            await c.aclose()

    asyncio.run(main())
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 5
