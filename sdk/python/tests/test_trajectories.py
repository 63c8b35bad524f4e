"""Trajectories, resume, snapshots and fork against a real `dsec up`
(function tier, which records, snapshots and forks like the others)."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from pathlib import Path
from typing import Iterator

import pytest

import libdsec
from libdsec import (
    AsyncSandbox,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    Sandbox,
    StepKind,
)

from conftest import RUN_ID, Conn


@pytest.fixture
def client(conn: Conn) -> Iterator[libdsec.Client]:
    c = libdsec.Client(**conn)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def traj_id(client: libdsec.Client) -> Iterator[str]:
    """A trajectory ID unique to this test, with "/" in it; deleted after."""
    tid = f"pytest-{RUN_ID}/{uuid.uuid4().hex[:8]}/rollout-1"
    try:
        yield tid
    finally:
        client.trajectories.delete(tid)


def test_record_and_read_back(client: libdsec.Client, traj_id: str, labels: dict[str, str], tmp_path: Path) -> None:
    sb = Sandbox.create(tier="function", trajectory=traj_id, metadata=labels, client=client)
    try:
        assert sb.trajectory == traj_id and sb.incarnation == 1
        sb.files.write("notes/a.txt", "first\n")
        assert sb.commands.run(["cat", "/workspace/notes/a.txt"]).stdout == "first\n"
        sb.commands.run(["write", "/workspace/b.txt"], stdin="second\n")
        head = client.trajectories.get(traj_id)
        assert (head.id, head.state, head.sandbox, head.incarnations) == (traj_id, "recording", sb.sandbox_id, 1)
        # Reads are not steps: create, write, exec (cat), exec (write).
        assert head.steps == 4
    finally:
        sb.kill()

    steps = list(client.trajectories.steps(traj_id))
    kinds = [s.kind for s in steps]
    assert kinds[:4] == [StepKind.CREATE, StepKind.WRITE, StepKind.EXEC, StepKind.EXEC], kinds
    assert kinds[-1] == StepKind.END and [s.step for s in steps] == list(range(1, len(steps) + 1))
    create, write, cat, made = steps[:4]
    assert create.create is not None and create.create.request.get("tier") == "function"
    assert write.file is not None and write.file.path.endswith("notes/a.txt") and not write.pure
    assert cat.exec is not None and cat.exec.cmd == ["cat", "/workspace/notes/a.txt"] and cat.exec.stdout == "first\n"
    assert cat.pure, "a cat changes nothing"
    assert made.exec is not None and not made.pure, "a command that writes a file is not pure"
    assert client.trajectories.blob(traj_id, write.file.digest) == b"first\n"
    assert client.trajectories.get(traj_id).state == "ended"

    out = tmp_path / "traj.jsonl"
    assert client.trajectories.export(traj_id, out) == len(steps)
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["step"] for e in exported] == [s.step for s in steps]
    assert [e["kind"] for e in exported] == kinds


def test_resume_a_deleted_sandbox(client: libdsec.Client, traj_id: str, labels: dict[str, str]) -> None:
    sb = Sandbox.create(tier="function", trajectory=traj_id, metadata=labels, client=client)
    try:
        sb.files.write("src/main.txt", "from the API\n")
        sb.commands.run(["write", "/workspace/out.txt"], stdin="from a command\n")
        sb.commands.run(["echo", "pure"])
    finally:
        sb.kill()

    resumed = Sandbox.resume(traj_id, client=client)
    try:
        r = resumed.resume_result
        assert r is not None and r.divergence is None
        assert r.replayed >= 2 and r.skipped >= 1, r
        assert resumed.sandbox_id != sb.sandbox_id
        assert resumed.trajectory == traj_id and resumed.incarnation == 2
        assert resumed.files.read("src/main.txt") == "from the API\n"
        assert resumed.files.read("out.txt") == "from a command\n"
        # It records on: a new step lands after the resume step.
        resumed.commands.run(["write", "/workspace/later.txt"], stdin="x")
        steps = list(client.trajectories.steps(traj_id))
        kinds = [s.kind for s in steps]
        assert StepKind.RESUME in kinds and kinds[-1] == StepKind.EXEC
        assert client.trajectories.get(traj_id).incarnations == 2
    finally:
        resumed.kill()


def test_fork_three(client: libdsec.Client, labels: dict[str, str]) -> None:
    parent = Sandbox.create(tier="function", metadata=labels, client=client)
    kids: list[Sandbox] = []
    try:
        parent.files.write("base.txt", "from the parent\n")
        forked = parent.fork(count=3)
        kids = list(forked)
        assert len(kids) == 3 and forked.snapshot.id
        assert len({k.sandbox_id for k in kids} | {parent.sandbox_id}) == 4
        for k in kids:
            assert k.files.read("base.txt") == "from the parent\n"
        kids[0].files.write("only-0.txt", "mine\n")
        assert kids[0].files.exists("only-0.txt")
        for other in (kids[1], kids[2], parent):
            assert not other.files.exists("only-0.txt")
        # And the parent's later writes are its own.
        parent.files.write("later.txt", "parent only\n")
        assert not any(k.files.exists("later.txt") for k in kids)
    finally:
        for k in kids:
            k.kill()
        parent.kill()


def test_snapshot_and_create_from_it(client: libdsec.Client, labels: dict[str, str]) -> None:
    sb = Sandbox.create(tier="function", metadata=labels, client=client)
    started: Sandbox | None = None
    try:
        sb.files.write("state.txt", "before the snapshot\n")
        snap = sb.snapshot()
        assert snap.id and snap.tier == "function" and snap.sandbox == sb.sandbox_id
        assert client.snapshots.get(snap.id).id == snap.id
        sb.files.write("after.txt", "after the snapshot\n")
        started = Sandbox.create(from_snapshot=snap.id, metadata=labels, client=client)
        assert started.tier == "function"
        assert started.files.read("state.txt") == "before the snapshot\n"
        assert not started.files.exists("after.txt")
    finally:
        if started is not None:
            started.kill()
        sb.kill()
    assert client.snapshots.delete(snap.id) is True
    with pytest.raises(NotFoundError) as ei:
        client.snapshots.get(snap.id)
    assert ei.value.code == "snapshot_not_found"


def test_bad_input(client: libdsec.Client, traj_id: str, labels: dict[str, str]) -> None:
    with pytest.raises(NotFoundError) as nf:
        client.trajectories.get(f"pytest-{RUN_ID}/no-such-trajectory")
    assert nf.value.code == "trajectory_not_found"
    with pytest.raises(NotFoundError) as nf:
        Sandbox.resume(f"pytest-{RUN_ID}/no-such-trajectory", client=client)
    assert nf.value.code == "trajectory_not_found"

    sb = Sandbox.create(tier="function", trajectory=traj_id, secret_env={"API_KEY": "s3cret-value"},
                        metadata=labels, client=client)
    try:
        with pytest.raises(InvalidArgumentError) as bad:
            sb.fork(count=0)
        assert bad.value.code == "invalid_fork_count"
        # A refused fork made nothing.
        assert [s.id for s in Sandbox.list(metadata=labels, client=client)] == [sb.sandbox_id]
        with pytest.raises(ConflictError) as running:
            Sandbox.resume(traj_id, secret_env={"API_KEY": "s3cret-value"}, client=client)
        assert running.value.code == "trajectory_running"
    finally:
        sb.kill()

    with pytest.raises(InvalidArgumentError) as missing:
        Sandbox.resume(traj_id, client=client)
    assert missing.value.code == "secret_env_missing"
    # The secret's value is nowhere in the log.
    log = io.BytesIO()
    assert client.trajectories.export(traj_id, log) >= 2
    assert b"API_KEY" in log.getvalue() and b"s3cret-value" not in log.getvalue()
    resumed = Sandbox.resume(traj_id, secret_env={"API_KEY": "s3cret-value"}, client=client)
    try:
        assert "API_KEY=s3cret-value" in resumed.commands.run(["env"]).stdout.splitlines()
    finally:
        resumed.kill()


def test_async_record_and_resume(conn: Conn, traj_id: str, labels: dict[str, str]) -> None:
    async def main() -> None:
        async with libdsec.AsyncClient(**conn) as c:
            sb = await AsyncSandbox.create(tier="function", trajectory=traj_id, metadata=labels, client=c)
            try:
                await sb.files.write("a.txt", "async\n")
            finally:
                await sb.kill()
            kinds = [s.kind async for s in c.trajectories.steps(traj_id)]
            assert kinds[:2] == [StepKind.CREATE, StepKind.WRITE] and kinds[-1] == StepKind.END
            resumed = await AsyncSandbox.resume(traj_id, client=c)
            try:
                assert resumed.resume_result is not None and resumed.resume_result.replayed >= 1
                assert await resumed.files.read("a.txt") == "async\n"
            finally:
                await resumed.kill()

    asyncio.run(main())
