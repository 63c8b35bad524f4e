"""One parameter switches the substrate: the same script on the function,
container, microvm and vm tiers, against a real `dsec up` (conftest.py
gives it a [microvm] section over the shared guest kernel cache; the vm
tier shares it). The microvm and vm cases boot one VM each (a few seconds
under TCG)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
from conftest import Conn, DSecServer

from libdsec import Sandbox

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


@pytest.mark.parametrize("tier", TIERS)
def test_one_parameter_switches_the_substrate(tier: str, conn: Conn, labels: dict[str, str]) -> None:
    if tier in ("microvm", "vm") and shutil.which("qemu-system-x86_64") is None:
        pytest.skip(f"the {tier} tier needs QEMU (Debian qemu-system-x86)")
    with Sandbox.create(tier=tier, metadata=labels, **conn) as sb:
        assert sb.get_info().tier == tier
        assert script(sb) == ("same script\n", "one parameter\n", "one parameter\n")


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
