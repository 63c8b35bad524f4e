"""One parameter switches the substrate: the same script on the function,
container, microvm and vm tiers (files and commands, relative paths meaning
the same directory on each), against a real `dsec up` (conftest.py
gives it a [microvm] section over the shared guest kernel cache; the vm
tier shares it). The microvm and vm cases boot one VM each (a few seconds
under TCG)."""

from __future__ import annotations

import shutil
import time
from typing import Any
from pathlib import Path

import httpx
import pytest
from conftest import Conn, DSecServer

from libdsec import NotFoundError, Sandbox

TIERS = ["function", "container", "microvm", "vm"]


def qemu_under(data_dir: Path) -> list[str]:
    """Command lines of the QEMU processes that name data_dir."""
    out = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if "qemu" in cmd and str(data_dir) in cmd:
            out.append(f"{p.name}: {cmd}")
    return out


def script(sb: Sandbox) -> tuple[str, str, str]:
    """The same calls on every tier: a command, a file written and read
    through the files API, and read again by a command."""
    echoed = sb.commands.run(["echo", "same", "script"]).stdout
    info = sb.files.write("note.txt", "one parameter\n")
    read = sb.files.read("note.txt")
    catted = sb.commands.run(["cat", info.path]).stdout
    return echoed, read, catted


def workdir_script(sb: Sandbox, tier: str) -> None:
    """A relative path means /workspace, the directory commands start in,
    for the files API and for commands alike: the most common pattern of
    an agent harness (write a file, run a command on it)."""
    sb.files.write("x/hello.txt", "hi\n")
    assert sb.commands.run("cat x/hello.txt").stdout == "hi\n"
    assert sb.commands.run(["cat", "x/hello.txt"]).stdout == "hi\n"
    # Nested directories; the absolute path is the same file.
    info = sb.files.write("a/b/c.txt", "nested\n")
    assert info.path == "/workspace/a/b/c.txt"
    assert sb.files.read("/workspace/a/b/c.txt") == "nested\n"
    assert sb.commands.run(["cat", "/workspace/a/b/c.txt"]).stdout == "nested\n"
    # A command's cwd, relative or absolute, leads its relative paths.
    for cwd in ("a/b", "/workspace/a/b"):
        assert sb.commands.run(["cat", "c.txt"], cwd=cwd).stdout == "nested\n"
    with pytest.raises(NotFoundError):
        sb.commands.run(["cat", "c.txt"], cwd="no/such/dir")
    # What a command writes by a relative path, the files API reads by it.
    writer = ["write", "by-cmd.txt"] if tier == "function" else ["sh", "-c", "cat > by-cmd.txt"]
    sb.commands.run(writer, stdin="by a command\n")
    assert sb.files.read("by-cmd.txt") == "by a command\n"
    assert sb.files.get_info("by-cmd.txt").mode == 0o644
    names = {e.path for e in sb.files.list(".")}
    assert {"/workspace/x", "/workspace/a", "/workspace/by-cmd.txt"} <= names, names
    assert "PWD=/workspace/a" in sb.commands.run(["env"], cwd="a").stdout.splitlines()


@pytest.mark.parametrize("tier", TIERS)
def test_one_parameter_switches_the_substrate(tier: str, conn: Conn, labels: dict[str, str]) -> None:
    if tier in ("microvm", "vm") and shutil.which("qemu-system-x86_64") is None:
        pytest.skip(f"the {tier} tier needs QEMU (Debian qemu-system-x86)")
    with Sandbox.create(tier=tier, metadata=labels, **conn) as sb:
        assert sb.get_info().tier == tier
        assert script(sb) == ("same script\n", "one parameter\n", "one parameter\n")
        workdir_script(sb, tier)


def test_microvm_node_and_leftovers(server: DSecServer, conn: Conn, labels: dict[str, str]) -> None:
    """The node reports the tier's accelerator; a killed microvm leaves no
    QEMU behind. Runs after the parametrised test: no boot of its own
    unless run alone."""
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("the microvm tier needs QEMU (Debian qemu-system-x86)")
    r = httpx.get(f"{server.url}/v1/nodes", headers={"Authorization": f"Bearer {server.token}"}, timeout=10)
    r.raise_for_status()
    tiers = {t["name"]: t for n in r.json()["nodes"] for t in n["tiers"]}
    assert tiers["microvm"]["available"], tiers["microvm"]
    assert tiers["microvm"]["accelerator"] in ("tcg", "kvm"), tiers["microvm"]
    assert not qemu_under(server.data_dir), "QEMU processes left by earlier tests"


def test_microvm_phases(conn: Conn, labels: dict[str, str]) -> None:
    """Phases on a VM through the API: the guest's agent ends the earlier
    phase's processes and applies writable paths and the user; the network
    of a later phase gives the VM its NIC from the start; the integrity
    report says which parts the guest enforced and that the node's
    monitor did not watch it. One boot."""
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("the microvm tier needs QEMU (Debian qemu-system-x86)")
    phases: list[dict[str, Any]] = [
        {"name": "setup"},
        {"name": "coding", "writable": ["/workspace"], "user": "1000",
         "network": {"egress": "allowlist", "allow": [{"cidr": "192.0.2.9/32", "proto": "tcp", "ports": "80"}]}},
    ]
    with Sandbox.create(tier="microvm", phases=phases, metadata=labels, **conn) as sb:
        r = sb.commands.run("mkdir -p /workspace && chmod 777 /workspace && (setsid sleep 600 &) && id -u")
        assert r.stdout == "0\n" and r.phase == "setup", r
        assert sb.set_phase("coding").phase == "coding"
        r = sb.commands.run("id -u; pgrep sleep || echo no-sleep; touch /workspace/ok && echo wrote; touch /etc/no 2>&1; ip -4 -o addr | grep -vc ' lo '; true")
        lines = r.stdout.splitlines()
        assert lines[:3] == ["1000", "no-sleep", "wrote"] and "Read-only file system" in r.stdout and lines[-1] == "1", r
        report = sb.integrity()
        assert report.monitored is False, report
        assert {"writable", "user", "processes"} <= set(report.guest_enforced), report
        assert [p.phase for p in report.phases] == ["setup", "coding"], report


def test_microvm_guest_panic_fails_the_sandbox(server: DSecServer, conn: Conn, labels: dict[str, str]) -> None:
    """A VM whose guest panics from inside is failed within about a second of
    QEMU's end, says why, and leaves no QEMU. One boot."""
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("the microvm tier needs QEMU (Debian qemu-system-x86)")
    sb = Sandbox.create(tier="microvm", metadata=labels, **conn)
    try:
        assert sb.commands.run("echo up").stdout == "up\n"
        try:  # the call ends with the guest: its error is no concern here
            sb.commands.run("echo c > /proc/sysrq-trigger")
        except Exception:
            pass
        deadline = time.monotonic() + 10
        while (info := sb.get_info()).state != "failed":
            assert time.monotonic() < deadline, f"still {info.state} 10 s after the panic"
            time.sleep(0.05)
        assert info.reason.startswith("guest_panicked: the guest kernel panicked: Kernel panic"), info
        assert not sb.is_running()
        assert not qemu_under(server.data_dir), "QEMU left after the panic"
    finally:
        sb.kill()
