"""Sandbox lifecycle against a real `dsec up`."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from conftest import Conn

from libdsec import (
    AuthenticationError,
    InvalidArgumentError,
    NotFoundError,
    Sandbox,
    SandboxInfo,
    SandboxNotRunningError,
    SandboxStats,
)


def test_create_get_info(conn: Conn, labels: dict[str, str]) -> None:
    sb = Sandbox.create(tier="function", timeout=120, envs={"FROM_CREATE": "1"}, metadata=labels, **conn)
    try:
        assert sb.sandbox_id and sb.tier == "function"
        info = sb.get_info()
        assert isinstance(info, SandboxInfo)
        assert info.id == sb.sandbox_id == info.sandbox_id
        assert info.tier == "function" and info.state == "running"
        assert info.image, "the tier's default image has a name"
        assert info.labels == labels and info.metadata == labels
        assert info.timeout_s == 120
        assert info.created_at is not None and info.expires_at is not None
        assert info.created_at.tzinfo is not None
        assert timedelta(seconds=100) < info.expires_at - info.created_at <= timedelta(seconds=121)
        assert sb.is_running()
        assert Sandbox.connect(sb.sandbox_id, **conn).sandbox_id == sb.sandbox_id
    finally:
        assert sb.kill() is True
    assert not sb.is_running()
    with pytest.raises(NotFoundError):
        Sandbox.connect(sb.sandbox_id, **conn)
    # Calls on an ended sandbox raise NotFoundError too.
    with pytest.raises(NotFoundError):
        sb.commands.run(["echo", "late"])
    with pytest.raises(NotFoundError):
        sb.files.read("x")


def test_labels_alias(conn: Conn, labels: dict[str, str]) -> None:
    with Sandbox.create(tier="function", labels=labels, **conn) as sb:
        assert sb.get_info().labels == labels


def test_list_filter_and_pagination(conn: Conn, labels: dict[str, str]) -> None:
    made = [Sandbox.create(tier="function", metadata=labels, **conn) for _ in range(3)]
    try:
        ids = [s.sandbox_id for s in made]
        listed = Sandbox.list(metadata=labels, **conn)
        assert [s.id for s in listed] == ids[::-1], "newest first"
        assert all(s.labels == labels and s.state == "running" for s in listed)
        # One label of several is enough to filter on.
        assert {s.id for s in Sandbox.list(metadata={"uid": labels["uid"]}, **conn)} == set(ids)
        # list() follows next_page_token to the end.
        assert [s.id for s in Sandbox.list(metadata=labels, limit=1, **conn)] == ids[::-1]
        page1, token = Sandbox.list_page(metadata=labels, limit=2, **conn)
        assert len(page1) == 2 and token
        page2, token2 = Sandbox.list_page(metadata=labels, limit=2, page_token=token, **conn)
        assert len(page2) == 1 and token2 is None
        assert [s.id for s in page1 + page2] == ids[::-1]
        assert {s.id for s in Sandbox.list(metadata=labels, tier="function", state="running", **conn)} == set(ids)
        assert Sandbox.list(metadata=labels, tier="vm", **conn) == []
        assert Sandbox.list(metadata={"uid": "no-such-label-value"}, **conn) == []
    finally:
        for s in made:
            s.kill()
    assert Sandbox.list(metadata=labels, state="running", **conn) == []


def test_set_timeout(sandbox: Sandbox) -> None:
    before = sandbox.get_info()
    info = sandbox.set_timeout(900)
    assert info.id == sandbox.sandbox_id
    assert info.expires_at is not None and before.expires_at is not None
    assert info.expires_at > before.expires_at
    expected = datetime.now(timezone.utc) + timedelta(seconds=900)
    assert abs((info.expires_at - expected).total_seconds()) < 60
    assert abs((sandbox.get_info().expires_at - info.expires_at).total_seconds()) < 1  # type: ignore[operator]
    with pytest.raises(InvalidArgumentError):
        sandbox.set_timeout(0)


def test_function_stats(conn: Conn, labels: dict[str, str]) -> None:
    sb = Sandbox.create(tier="function", memory_mb=64, disk_mb=32, metadata=labels, **conn)
    try:
        idle = sb.stats()
        assert isinstance(idle, SandboxStats)
        # The caps it was made with, in bytes.
        assert (idle.memory_limit_bytes, idle.disk_limit_bytes) == (64 << 20, 32 << 20)
        # No OS and no processes: memory and processes count the calls
        # running now, and there are none.
        assert (idle.memory_bytes, idle.processes) == (0, 0)
        assert (idle.disk_full, idle.oom_kills, idle.pids_limited) == (False, 0, 0)

        sb.files.write("fill.bin", b"\0" * (2 << 20))
        sb.commands.run(["echo", "hi"])
        after = sb.stats()
        assert after.disk_bytes - idle.disk_bytes >= 2 << 20
        # cpu_seconds is the time spent in calls.
        assert after.cpu_seconds > idle.cpu_seconds
        assert after.processes == 0 and not after.disk_full

        # While a call runs, it is a process with linear memory.
        done = threading.Event()

        def sleep() -> None:
            sb.commands.run(["sleep", "3"])
            done.set()

        call = threading.Thread(target=sleep)
        call.start()
        try:
            deadline = time.monotonic() + 2.5
            busy = sb.stats()
            while busy.processes == 0 and not done.is_set() and time.monotonic() < deadline:
                time.sleep(0.05)
                busy = sb.stats()
            assert busy.processes == 1 and 0 < busy.memory_bytes <= busy.memory_limit_bytes, busy
        finally:
            call.join(10)
        assert done.is_set()
        assert sb.stats().processes == 0
    finally:
        sb.kill()
    with pytest.raises(SandboxNotRunningError) as e:
        sb.stats()
    assert e.value.code == "sandbox_not_running" and e.value.status == 409


def test_kill_unknown_and_not_found(conn: Conn) -> None:
    assert Sandbox.kill_by_id("sb-does-not-exist-0000", **conn) is False
    with pytest.raises(NotFoundError) as ei:
        Sandbox.connect("sb-does-not-exist-0000", **conn)
    assert ei.value.status == 404 and ei.value.code


def test_kill_by_id(conn: Conn, labels: dict[str, str]) -> None:
    sb = Sandbox.create(tier="function", metadata=labels, **conn)
    assert Sandbox.kill_by_id(sb.sandbox_id, **conn) is True
    assert not sb.is_running()


def test_context_manager_kills(conn: Conn, labels: dict[str, str]) -> None:
    with Sandbox.create(tier="function", metadata=labels, **conn) as sb:
        sid = sb.sandbox_id
        assert sb.commands.run(["echo", "inside"]).stdout == "inside\n"
    with pytest.raises(NotFoundError):
        Sandbox.connect(sid, **conn)
    # The sandbox is killed when the block raises too, and the error propagates.
    with pytest.raises(ZeroDivisionError):
        with Sandbox.create(tier="function", metadata=labels, **conn) as sb2:
            sid2 = sb2.sandbox_id
            1 / 0
    with pytest.raises(NotFoundError):
        Sandbox.connect(sid2, **conn)


def test_bad_token(conn: Conn) -> None:
    with pytest.raises(AuthenticationError) as ei:
        Sandbox.list(url=conn["url"], token="not-the-token")
    assert ei.value.status == 401


def test_env_configuration(conn: Conn, labels: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSEC_URL", conn["url"])
    monkeypatch.setenv("DSEC_TOKEN", conn["token"])
    with Sandbox.create(tier="function", metadata=labels) as sb:
        assert sb.commands.run(["echo", "via-env"]).stdout == "via-env\n"
        assert [s.id for s in Sandbox.list(metadata=labels)] == [sb.sandbox_id]
