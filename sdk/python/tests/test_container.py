"""The container tier through the SDK, against a real `dsec up` (conftest.py
gives it a [container] section with a network and cgroup parent of its own)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import Conn, DSecServer

from libdsec import (
    AsyncClient,
    AsyncSandbox,
    CommandExitError,
    ConflictError,
    ConnectionError,
    GradeResult,
    IntegrityReport,
    InvalidArgumentError,
    Layer,
    NotFoundError,
    Sandbox,
    SandboxNotRunningError,
    SandboxStats,
    UnsupportedError,
)


@pytest.fixture
def container(conn: Conn, labels: dict[str, str]) -> Iterator[Sandbox]:
    """A container sandbox of the busybox image, killed after the test."""
    sb = Sandbox.create(tier="container", image="busybox", memory_mb=128, disk_mb=64, metadata=labels, **conn)
    try:
        yield sb
    finally:
        sb.kill()


def test_container_create_and_exec(container: Sandbox, conn: Conn, labels: dict[str, str]) -> None:
    info = container.get_info()
    assert container.tier == info.tier == "container"
    assert info.state == "running" and info.image.startswith("busybox")
    assert (info.memory_mb, info.disk_mb) == (128, 64)
    assert info.network is None or info.network.get("egress", "none") == "none"
    assert [s.id for s in Sandbox.list(metadata=labels, tier="container", **conn)] == [container.sandbox_id]

    # A command line runs under /bin/sh -c; argv runs as given.
    assert container.commands.run("echo $((6 * 7)) | tr 4 x").stdout == "x2\n"
    assert container.commands.run(["id", "-u"]).stdout == "0\n"
    assert container.commands.run(["cat"], stdin="piped\n").stdout == "piped\n"
    r = container.commands.run("echo $A in $(pwd)", envs={"A": "b"}, cwd="/tmp")
    assert r.stdout == "b in /tmp\n"
    with pytest.raises(CommandExitError) as e:
        container.commands.run("echo oops >&2; exit 3")
    assert e.value.exit_code == 3 and e.value.stderr == "oops\n"
    out: list[str] = []
    container.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=out.append)
    assert "".join(out) == "1\n2\n3\n"


def test_container_files(container: Sandbox) -> None:
    data = bytes(range(256)) * 128  # every byte value (larger: see the next test)
    info = container.files.write("/data/in/blob.bin", data)
    assert info.path == "/data/in/blob.bin" and info.size == len(data)
    assert container.files.read("/data/in/blob.bin", format="bytes") == data
    # What the API writes, commands read; and the other way round.
    r = container.commands.run(["sha256sum", "/data/in/blob.bin"])
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    container.commands.run("mkdir -p /data/out && echo from-a-command > /data/out/note.txt")
    assert container.files.read("/data/out/note.txt") == "from-a-command\n"
    # Files of the image are there, and may be replaced (copy-up).
    assert container.files.get_info("/bin/busybox").size > 100_000
    assert container.files.read("/etc/hostname") == container.sandbox_id + "\n"
    container.files.write("/etc/motd", "welcome\n")
    assert container.commands.run(["cat", "/etc/motd"]).stdout == "welcome\n"
    names = sorted(e.path for e in container.files.list("/data", depth=2))
    assert names == ["/data/in", "/data/in/blob.bin", "/data/out", "/data/out/note.txt"]
    assert container.files.exists("/data/out/note.txt")
    container.files.rename("/data/out/note.txt", "/data/in/note.txt")
    container.files.remove("/data", recursive=True)
    assert not container.files.exists("/data")
    with pytest.raises(NotFoundError):
        container.files.read("/data/in/note.txt")


def test_container_large_file_download(container: Sandbox) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    container.files.write("/tmp/big.bin", data)
    assert container.commands.run(["sha256sum", "/tmp/big.bin"]).stdout.split()[0] == hashlib.sha256(data).hexdigest()
    try:
        got = container.files.read("/tmp/big.bin", format="bytes")
    except ConnectionError as e:
        # Reported, not hidden: the node opens the file with its RPC's
        # context, which ends when the open returns (internal/node/files.go
        # fileOpen; internal/node/rpc.go), and the container tier's reader
        # is bound to it: reads past the first ~64 KiB fail.
        pytest.xfail(f"known bug: container-tier downloads over ~64 KiB break off: {e}")
    assert got == data


def test_container_background_processes(container: Sandbox) -> None:
    h = container.commands.run("read line; echo got $line", background=True)
    assert h.pid in [p.pid for p in container.commands.list()]
    h.send_stdin("hello\n")
    assert h.wait(timeout=10).stdout == "got hello\n"

    sleeper = container.commands.run(["sleep", "1000"], background=True)
    assert container.commands.connect(sleeper.pid).info().state == "running"
    assert sleeper.kill() is True
    with pytest.raises(CommandExitError) as e:
        sleeper.wait(timeout=10)
    assert e.value.exit_code != 0
    # Its process is gone from the sandbox.
    ps = container.commands.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout
    assert "sleep 1000" not in ps


def test_container_stats(container: Sandbox) -> None:
    before = container.stats()
    assert isinstance(before, SandboxStats)
    # The limits it was made with (memory_mb=128, disk_mb=64), in bytes.
    assert before.memory_limit_bytes == 128 << 20
    assert before.disk_limit_bytes == 64 << 20
    # The agent runs in it, so it uses memory and tasks from the start.
    assert before.memory_bytes > 0 and before.processes >= 1
    assert 0 <= before.disk_bytes < 1 << 20
    assert before.memory_peak_bytes == 0 or before.memory_peak_bytes >= before.memory_bytes
    assert (before.disk_full, before.oom_kills, before.pids_limited) == (False, 0, 0)

    container.commands.run("dd if=/dev/zero of=/tmp/fill bs=1M count=2")
    after = container.stats()
    assert after.disk_bytes - before.disk_bytes >= 2 << 20
    # The writable layer is a tmpfs whose pages are charged to the sandbox.
    assert after.memory_bytes >= 2 << 20
    assert after.memory_peak_bytes == 0 or after.memory_peak_bytes >= after.memory_bytes
    assert after.cpu_seconds > 0 and after.cpu_seconds >= before.cpu_seconds
    assert after.memory_limit_bytes == before.memory_limit_bytes and not after.disk_full

    sleepers = [container.commands.run(["sleep", "1000"], background=True) for _ in range(3)]
    try:
        assert container.stats().processes >= after.processes + 3
    finally:
        for h in sleepers:
            h.kill()


def test_container_stats_disk_full(conn: Conn, labels: dict[str, str]) -> None:
    with Sandbox.create(tier="container", image="busybox", disk_mb=16, metadata=labels, **conn) as sb:
        r = sb.commands.run("dd if=/dev/zero of=/tmp/fill bs=1M count=32 2>&1; echo rc=$?")
        assert "No space left on device" in r.stdout and "rc=0" not in r.stdout, r
        st = sb.stats()
        assert st.disk_full and st.disk_limit_bytes == 16 << 20
        assert st.disk_limit_bytes - (64 << 10) < st.disk_bytes <= st.disk_limit_bytes
        sb.files.remove("/tmp/fill")
        st = sb.stats()
        assert not st.disk_full and st.disk_bytes < 1 << 20
    # An ended sandbox has no stats.
    with pytest.raises(SandboxNotRunningError) as e:
        sb.stats()
    assert e.value.code == "sandbox_not_running"


def test_container_stats_async(conn: Conn, labels: dict[str, str]) -> None:
    async def main() -> tuple[SandboxStats, SandboxStats]:
        try:
            async with await AsyncSandbox.create(
                tier="container", image="busybox", memory_mb=96, metadata=labels, **conn
            ) as sb:
                before = await sb.stats()
                await sb.files.write("/root/blob.bin", b"\xa5" * (2 << 20))
                return before, await sb.stats()
        finally:
            await AsyncClient.aclose_shared()

    before, after = asyncio.run(main())
    assert isinstance(after, SandboxStats)
    assert before.memory_limit_bytes == after.memory_limit_bytes == 96 << 20
    assert before.memory_bytes > 0 and before.processes >= 1
    assert after.disk_bytes - before.disk_bytes >= 2 << 20


def test_container_writes_are_its_own(conn: Conn, labels: dict[str, str]) -> None:
    with Sandbox.create(tier="container", image="busybox", metadata=labels, **conn) as a, Sandbox.create(
        tier="container", image="busybox", metadata=labels, **conn
    ) as b:
        a.files.write("/root/secret.txt", "a's\n")
        assert a.files.exists("/root/secret.txt")
        assert not b.files.exists("/root/secret.txt")
        assert b.commands.run("cat /root/secret.txt 2>&1 || true").stdout.endswith("No such file or directory\n")


def _node_address() -> str:
    """The node's address on its default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.connect(("198.51.100.1", 9))
        addr = u.getsockname()[0]
    assert not addr.startswith("127."), f"the node has no address but loopback: {addr}"
    return str(addr)


def test_container_network_policy(conn: Conn, labels: dict[str, str]) -> None:
    # No egress by default: the resolver file says so, and the node is not
    # reachable, though it listens on all its addresses (the test's own
    # connection to it is the proof that it does).
    srv = socket.socket()
    srv.bind(("0.0.0.0", 0))
    srv.listen(8)
    port = srv.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.sendall(b"ok\n")
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        with Sandbox.create(tier="container", image="busybox", network="none", metadata=labels, **conn) as sb:
            assert "no network egress" in sb.files.read("/etc/resolv.conf")
            node = _node_address()
            with socket.create_connection((node, port), timeout=2) as c:
                assert c.recv(3) == b"ok\n"
            r = sb.commands.run(f"timeout 5 nc {node} {port}; echo rc=$?")
            assert "ok" not in r.stdout and "rc=0" not in r.stdout, r
    finally:
        srv.close()

    policy = {"egress": "allowlist", "allow": [{"cidr": "198.51.100.7"}, {"cidr": "203.0.113.0/28", "proto": "tcp", "ports": 443}]}
    with Sandbox.create(tier="container", image="busybox", network=policy, metadata=labels, **conn) as sb:
        got = sb.get_info().network
        assert got is not None and got["egress"] == "allowlist"
        assert got["allow"] == [
            {"cidr": "198.51.100.7"},
            {"cidr": "203.0.113.0/28", "proto": "tcp", "ports": "443"},
        ]

    with Sandbox.create(tier="container", image="busybox", network="open", metadata=labels, **conn) as sb:
        assert sb.get_info().network == {"egress": "open"}

    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(tier="container", image="busybox", network="sometimes", metadata=labels, **conn)
    assert e.value.code == "invalid_network_policy"
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(tier="container", image="busybox", network={"egress": "allowlist", "allow": [{"cidr": "10.0.0.0/33"}]}, metadata=labels, **conn)
    assert e.value.code == "invalid_network_policy"
    with pytest.raises(UnsupportedError) as u:
        Sandbox.create(tier="function", network="open", metadata=labels, **conn)
    assert u.value.code == "tier_has_no_network"
    # Nothing was made by the refused creates.
    assert [s.state for s in Sandbox.list(metadata=labels, state="running", **conn)] == []


def test_container_async(conn: Conn, labels: dict[str, str]) -> None:
    async def one(i: int) -> str:
        async with await AsyncSandbox.create(tier="container", image="busybox", network="none", metadata=labels, **conn) as sb:
            await sb.files.write(f"/tmp/{i}.txt", f"task-{i}")
            return (await sb.commands.run(f"cat /tmp/{i}.txt")).stdout

    async def main() -> list[str]:
        try:
            return list(await asyncio.gather(*(one(i) for i in range(4))))
        finally:
            await AsyncClient.aclose_shared()

    assert asyncio.run(main()) == [f"task-{i}" for i in range(4)]


def test_container_phases(conn: Conn, labels: dict[str, str]) -> None:
    phases: list[dict[str, Any]] = [
        {"name": "setup"},
        {"name": "coding", "writable": ["/workspace"], "user": "1000"},
        {"name": "submit", "writable": []},
    ]
    with Sandbox.create(tier="container", image="busybox", phases=phases, metadata=labels, **conn) as sb:
        assert sb.phase == "setup" and [p["name"] for p in sb.get_info().phases] == ["setup", "coding", "submit"]
        r = sb.commands.run("mkdir -p /workspace && chmod 777 /workspace && (setsid sleep 600 &) && id -u")
        assert r.stdout == "0\n" and r.phase == "setup", r
        info = sb.set_phase("coding")
        assert info.phase == sb.phase == "coding"
        r = sb.commands.run("id -u; pgrep sleep || echo no-sleep; touch /workspace/ok && echo wrote; touch /tmp/no 2>&1; true")
        assert r.stdout.startswith("1000\nno-sleep\nwrote\n") and "Read-only file system" in r.stdout and r.phase == "coding", r
        with pytest.raises(ConflictError) as e:
            sb.set_phase("setup")
        assert e.value.code == "phase_backwards"
        with pytest.raises(InvalidArgumentError) as e2:
            sb.set_phase("nope")
        assert e2.value.code == "unknown_phase"
        sb.set_phase("submit")
        r = sb.commands.run("touch /workspace/again 2>&1; cat /workspace/ok && echo kept")
        assert "Read-only file system" in r.stdout and "kept" in r.stdout, r
        assert sb.set_phase("setup", back=True).phase == "setup"


def test_container_phases_refused(conn: Conn, labels: dict[str, str]) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(tier="container", image="busybox", phases=[{"name": "a"}, {"name": "a"}], metadata=labels, **conn)
    assert e.value.code == "invalid_phase"
    with pytest.raises(InvalidArgumentError):
        Sandbox.create(tier="container", image="busybox", phases=[{"name": "a", "bogus": 1}], metadata=labels, **conn)


def test_container_phase_caps_and_executables(conn: Conn, labels: dict[str, str]) -> None:
    phases: list[dict[str, Any]] = [
        {"name": "setup"},
        {"name": "work", "user": "1000", "capabilities": ["dac_override"], "executables": ["/bin/busybox"]},
    ]
    with Sandbox.create(tier="container", image="busybox", phases=phases, metadata=labels, **conn) as sb:
        assert sb.get_info().phases[1]["capabilities"] == ["CAP_DAC_OVERRIDE"]
        r = sb.commands.run("echo s > /secret && chmod 600 /secret && cp /bin/busybox /tmp/true && /tmp/true true && echo ran")
        assert r.stdout == "ran\n", r
        sb.set_phase("work")
        r = sb.commands.run("grep CapEff /proc/self/status; cat /secret; /tmp/true true; echo rc=$?")
        assert r.stdout.split() == ["CapEff:", "0000000000000002", "s", "rc=137"], r
        deadline = time.monotonic() + 10
        while not any(e.rule == "exec-not-allowed" and e.path == "/tmp/true" for e in sb.events()):
            assert time.monotonic() < deadline, sb.events()
            time.sleep(0.1)
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(tier="container", image="busybox", capabilities=["sys_admin"], metadata=labels, **conn)
    assert e.value.code == "invalid_capability"


def test_container_audit_events(conn: Conn, labels: dict[str, str]) -> None:
    import time

    with Sandbox.create(tier="container", image="busybox", metadata=labels, **conn) as sb:
        sb.commands.run("mount -t tmpfs none /mnt; mkdir -p /w/tests && echo x > /w/tests/test_a.py; true")
        deadline = time.monotonic() + 10
        while True:
            evs = sb.events()
            rules = {(e.rule, e.verdict) for e in evs}
            if {("mount", "denied"), ("test-tampering", "allowed")} <= rules or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert ("mount", "denied") in rules and ("test-tampering", "allowed") in rules, evs
        assert all(e.sandbox == sb.sandbox_id and e.severity for e in evs)
        assert len(sb.events(skip=1, limit=1)) == 1
        rep = sb.integrity()
        assert isinstance(rep, IntegrityReport) and rep.sandbox == sb.sandbox_id, rep
        assert rep.suspicious and rep.monitored and rep.denied >= 1 and rep.events >= 2, rep
        assert {r.rule for r in rep.rules} >= {"mount", "test-tampering"}, rep
        assert all(r.count >= 1 and r.severity and r.first is not None for r in rep.rules), rep
        assert sum(rep.by_severity.values()) == sum(r.count for r in rep.rules), rep
        assert not rep.sealed_grading and rep.grades == [] and rep.guest_enforced == [], rep
    # The record outlives the sandbox.
    assert len(sb.events()) >= len(evs)


def test_container_sealed_grading(conn: Conn, labels: dict[str, str], tmp_path: Path) -> None:
    """sb.grade: the verdict of pristine tests on the agent's work, whatever
    the agent did to its copy of the tests."""
    tests = tmp_path / "layer" / "workspace" / "tests"
    tests.mkdir(parents=True)
    (tests / "run.sh").write_text(
        'mkdir -p "$(dirname "$1")"; . /workspace/solution.sh; c=""\n'
        "for t in /workspace/tests/test_*.sh; do n=$(basename $t .sh)\n"
        '  if ( . $t ); then c="$c<testcase name=\\"$n\\"/>"; '
        'else c="$c<testcase name=\\"$n\\"><failure/></testcase>"; fi\ndone\n'
        'echo "<testsuite>$c</testsuite>" > "$1"\n'
    )
    (tests / "test_add.sh").write_text('[ "$(add 2 3)" = 5 ]\n')
    Layer.build_dir(tmp_path / "layer", name="tests/sdk-adder:v1", url=conn["url"], token=conn["token"])
    cmd = ["sh", "/workspace/tests/run.sh", "/tmp/dsec-grade/junit.xml"]
    for solution, hack, verdict in (
        ("add() { echo $(($1 + $2)); }", "", "passed"),
        ("add() { echo 0; }", "echo 'exit 0' > /workspace/tests/test_add.sh", "failed"),
    ):
        with Sandbox.create(tier="container", image="busybox", metadata=labels, **conn) as sb:
            sb.files.write("/workspace/solution.sh", solution + "\n")
            if hack:
                sb.commands.run("mkdir -p /workspace/tests && " + hack)
            res = sb.grade("tests/sdk-adder:v1", cmd, expected_tests=1)
            assert isinstance(res, GradeResult), res
            passed = 1 if verdict == "passed" else 0
            assert res.verdict == verdict and (res.tests, res.passed, res.failed) == (1, passed, 1 - passed), res
            assert res.errors == 0 and res.skipped == 0 and res.declared_tests == 0, res
            assert (verdict == "passed") == (res.reason == ""), res
            assert res.sandbox == sb.sandbox_id and res.grader and res.grader != sb.sandbox_id, res
            assert [(c.name, c.status) for c in res.cases] == [("test_add", verdict)], res
            assert res.exit_code == 0 and not res.timed_out and res.duration_ms > 0, res
            assert res.carried >= 1 and res.carried_bytes > 0 and res.at is not None, res
            # The agent's copy of the tests under the sealed /workspace/tests never reaches the grading.
            assert any(d.startswith("/workspace/tests") for d in res.discarded) == bool(hack), res
            assert isinstance(res.integrity, IntegrityReport) and res.integrity.sealed_grading, res
            # The grading sandbox's own audit counted, and the honest
            # grader's write of its report hit no rule that counts.
            assert res.audited and res.grader_rules == [], res
            (summary,) = sb.integrity().grades
            assert (summary.tests_layer, summary.verdict, summary.tests) == ("tests/sdk-adder:v1", verdict, 1), summary
            # Indexing as when grade() returned the JSON's dict.
            assert res["verdict"] == verdict and res["integrity"]["sealed_grading"] is True
    with Sandbox.create(tier="container", image="busybox", metadata=labels, **conn) as sb:
        with pytest.raises(InvalidArgumentError) as e:
            sb.grade("tests/sdk-adder:v1", cmd, report="relative/junit.xml")
        assert e.value.code == "invalid_grade"


def test_container_follow_events(conn: Conn, labels: dict[str, str]) -> None:
    """sb.follow_events(): stored events, then new ones; it ends after the sandbox."""
    sb = Sandbox.create(tier="container", image="busybox", metadata=labels, **conn)
    try:
        sb.commands.run("mount -t tmpfs none /mnt; true")
        later = threading.Timer(0.3, lambda: sb.commands.run("mkdir -p /w/tests && echo x > /w/tests/test_f.py"))
        later.start()
        seen = set()
        for e in sb.follow_events():
            seen.add((e.rule, e.path))
            if ("test-tampering", "/w/tests/test_f.py") in seen:
                break
        later.join()
        assert ("mount", "/mnt") in seen, seen
    finally:
        sb.kill()
    # After the sandbox, the stream ends by itself with everything kept.
    assert ("test-tampering", "/w/tests/test_f.py") in {(e.rule, e.path) for e in sb.follow_events()}


def test_container_events_page_through(container: Sandbox, conn: Conn) -> None:
    """sb.events() returns every event, past the server's page of 1,000."""
    import httpx

    container.commands.run("i=0; while [ $i -lt 600 ]; do /bin/true; i=$((i+1)); done")

    def raw(skip: int = 0) -> list[dict[str, Any]]:
        r = httpx.get(
            f"{conn['url']}/v1/sandboxes/{container.sandbox_id}/events",
            params={"skip": skip, "limit": 10000},
            headers={"Authorization": f"Bearer {conn['token']}"},
            timeout=30,
        )
        r.raise_for_status()
        events: list[dict[str, Any]] = r.json()["events"]
        return events

    # The monitor's events arrive shortly after the command: wait until
    # their count stops growing.
    deadline, last = time.monotonic() + 20, -1
    while True:
        n = len(raw())
        if n == last or time.monotonic() > deadline:
            break
        last = n
        time.sleep(0.5)
    assert n > 1100, f"only {n} events for 600 execs"
    evs = container.events()
    assert len(evs) == n, f"events() returned {len(evs)} of the {n} stored"
    key = [(e.pid, e.kind, e.syscall, e.path) for e in evs]
    assert key == [(e["pid"], e["kind"], e.get("syscall", ""), e.get("path", "")) for e in raw()]
    assert len(container.events(limit=1001)) == 1001
    tail = container.events(skip=n - 5, limit=1500)
    assert [(e.pid, e.kind, e.syscall, e.path) for e in tail] == key[-5:]


def test_container_read_only_phase_raises_read_only(conn: Conn, labels: dict[str, str]) -> None:
    """A write the phase refuses is a ReadOnlyError (403), not an
    AuthenticationError."""
    from libdsec import AuthenticationError, PermissionDeniedError, ReadOnlyError

    phases: list[dict[str, Any]] = [{"name": "setup"}, {"name": "frozen", "writable": []}]
    with Sandbox.create(tier="container", image="busybox", phases=phases, metadata=labels, **conn) as sb:
        sb.files.write("/workspace/a.txt", "before")
        sb.set_phase("frozen")
        with pytest.raises(ReadOnlyError) as e:
            sb.files.write("/workspace/a.txt", "after")
        assert isinstance(e.value, PermissionDeniedError) and not isinstance(e.value, AuthenticationError)
        assert e.value.status == 403 and e.value.code == "read_only", e.value
        assert sb.files.read("/workspace/a.txt") == "before"


def test_container_executables_refusal_says_why(conn: Conn, labels: dict[str, str]) -> None:
    """A refused executables pattern's reason is in the exception's message;
    a tree pattern (dir/**) is accepted."""
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(
            tier="container", image="busybox", metadata=labels,
            phases=[{"name": "setup"}, {"name": "test", "executables": ["/usr/local/go/*/bin"]}], **conn,
        )
    assert e.value.code == "invalid_executable"
    assert "phase test" in str(e.value) and "/usr/local/go/*/bin" in str(e.value) and "trailing /*" in str(e.value), e.value
    phases: list[dict[str, Any]] = [{"name": "setup"}, {"name": "test", "executables": ["/bin/**"]}]
    with Sandbox.create(tier="container", image="busybox", phases=phases, metadata=labels, **conn) as sb:
        assert sb.get_info().phases[1]["executables"] == ["/bin/**"]
        sb.set_phase("test")
        assert sb.commands.run("echo ran").stdout == "ran\n"


def test_container_agent_death_fails_the_sandbox(server: DSecServer, conn: Conn, labels: dict[str, str]) -> None:
    """A sandbox whose agent dies (killed from the host: from inside it can no
    longer be) is failed within about a second, says why, refuses commands,
    and its audit events say how it ended."""
    sb = Sandbox.create(tier="container", image="busybox", metadata=labels, **conn)
    try:
        assert sb.commands.run("echo up").stdout == "up\n"
        state = server.data_dir / "node" / "container" / "sandboxes" / sb.sandbox_id / "state.json"
        os.kill(json.loads(state.read_text())["pid"], signal.SIGKILL)
        killed = time.monotonic()
        while (info := sb.get_info()).state != "failed":
            assert time.monotonic() - killed < 10, f"still {info.state} 10 s after the agent's kill"
            time.sleep(0.02)
        assert info.reason == "agent_exited: killed by SIGKILL", info
        assert not sb.is_running()
        with pytest.raises(SandboxNotRunningError):
            sb.commands.run("true")
        deadline = time.monotonic() + 10
        while not (ended := [e for e in sb.events() if e.kind == "sandbox-ended"]):
            assert time.monotonic() < deadline, "no sandbox-ended event"
            time.sleep(0.05)
        assert ended[0].detail == info.reason and ended[0].rule == "sandbox-ended", ended
        assert not state.parent.exists(), "the failed sandbox's directory is left"
    finally:
        sb.kill()
