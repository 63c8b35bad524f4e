"""Fixtures: a real DSec server (`dsec up`) for the whole session.

The binary is $DSEC_BIN, or built with `go build ./cmd/dsec` from the repo
root. If it cannot be built or started, every test that needs it ERRORS
with the reason (and the server log); nothing is skipped silently. Tests
that need no server (test_unit.py) run regardless.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, TypedDict

import httpx
import pytest

SDK_DIR = Path(__file__).resolve().parent.parent
if str(SDK_DIR) not in sys.path:
    sys.path.insert(0, str(SDK_DIR))

from libdsec import Sandbox  # noqa: E402

if TYPE_CHECKING:
    from _pytest.terminal import TerminalReporter

START_TIMEOUT = 60.0
BUILD_TIMEOUT = 900.0
STOP_TIMEOUT = 30.0
# Labels every sandbox the suite makes, so that one run's sandboxes are told apart.
RUN_ID = uuid.uuid4().hex[:8]

_server_log: list[Path] = []


def repo_root() -> Path:
    for d in [SDK_DIR, *SDK_DIR.parents]:
        if (d / "go.mod").is_file():
            return d
    raise RuntimeError(f"no go.mod in {SDK_DIR} or any parent")


def _tail(path: Path, n: int = 12000) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        return f"(no log: {e})"
    return data[-n:].decode("utf-8", "replace")


def _build(tmp: Path) -> Path:
    out = tmp / "dsec"
    root = repo_root()
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            ["go", "build", "-o", str(out), "./cmd/dsec"],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT,
        )
    except FileNotFoundError:
        pytest.fail("cannot build the DSec server: `go` is not on PATH (or set DSEC_BIN)", pytrace=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`go build ./cmd/dsec` took longer than {BUILD_TIMEOUT:.0f}s", pytrace=False)
    if p.returncode != 0:
        pytest.fail(
            f"`go build ./cmd/dsec` in {root} failed (exit {p.returncode}):\n"
            + p.stdout.decode("utf-8", "replace")[-8000:],
            pytrace=False,
        )
    print(f"\nbuilt {out} in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return out


@dataclass
class DSecServer:
    url: str
    token: str
    data_dir: Path
    log: Path
    proc: subprocess.Popen[bytes]
    binary: Path


def _wait_ready(proc: subprocess.Popen[bytes], data_dir: Path, log: Path) -> tuple[str, str]:
    deadline = time.monotonic() + START_TIMEOUT
    addr_file, token_file = data_dir / "api.addr", data_dir / "token"
    url = token = ""
    last = "nothing yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"`dsec up` exited with code {proc.returncode} before it was ready; log:\n{_tail(log)}",
                pytrace=False,
            )
        if not url and addr_file.is_file():
            addr = addr_file.read_text().strip()
            if addr:
                url = addr if "://" in addr else f"http://{addr}"
        if url:
            try:
                r = httpx.get(f"{url}/v1/health", timeout=2.0)
                last = f"GET /v1/health: {r.status_code} {r.text[:200]}"
                if r.status_code == 200 and token_file.is_file():
                    token = token_file.read_text().strip()
                    if token:
                        return url, token
                    last = "token file is empty"
            except httpx.HTTPError as e:
                last = f"GET /v1/health: {e!r}"
        time.sleep(0.1)
    pytest.fail(
        f"`dsec up` was not ready within {START_TIMEOUT:.0f}s (api.addr: {url or 'missing'}; last: {last}); "
        f"log:\n{_tail(log)}",
        pytrace=False,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise AssertionError(f"`dsec up` did not exit within {STOP_TIMEOUT:.0f}s of SIGTERM; killed it")
    assert proc.poll() is not None, "`dsec up` is still running"


def _remove_cgroup_parent(name: str) -> list[str]:
    """Removes the server's cgroup parent in every hierarchy (the node
    leaves it, empty, when it stops), and returns what could not go: a
    parent that still holds a sandbox's group."""
    left = []
    for parent in sorted(Path("/sys/fs/cgroup").glob(f"*/{name}")) + [Path("/sys/fs/cgroup") / name]:
        if not parent.is_dir():
            continue
        try:
            parent.rmdir()
        except OSError as e:
            left.append(f"{parent}: {e.strerror}")
    return left


@pytest.fixture(scope="session")
def dsec_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DSecServer]:
    tmp = tmp_path_factory.mktemp("dsec")
    binary = Path(os.environ["DSEC_BIN"]) if os.environ.get("DSEC_BIN") else _build(tmp)
    # The data dir's path must be short: a container sandbox's agent
    # listens on <data>/node/container/sandboxes/<id>/sock/agent.sock,
    # which must fit in the 108 bytes of a unix socket address, and
    # pytest's /tmp/pytest-of-<user>/pytest-<n>/dsec0/ leaves too little
    # room once n has two digits.
    short = Path(tempfile.mkdtemp(prefix="dsecpy"))
    data_dir = short / "data"
    log = tmp / "dsec.log"
    _server_log.append(log)
    # Container sandboxes run as an unprivileged host uid that must walk
    # down to their roots in the data dir: temporary directories are 0700.
    short.chmod(0o711)
    # A network, cgroup and id range of its own, apart from any DSec the
    # machine runs.
    config = tmp / "dsec.toml"
    config.write_text(
        "version = 1\n[container]\n"
        'name = "dpy"\nnetwork_range = "10.86.0.0/16"\ncgroup_parent = "dsec-pytest"\nnetwork_pool = 8\n'
        # The guest kernel cache of the Go tests: fetched once per machine.
        f'[microvm]\ncache_dir = "{Path(tempfile.gettempdir()) / "dsec-test-vmkernel"}"\n'
        # QEMU cgroups of its own too (a node's start-up sweeps its parents).
        'cgroup_parent = "dsec-pytest-microvm"\n[vm]\ncgroup_parent = "dsec-pytest-vm"\n'
    )
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            [str(binary), "up", "--config", str(config), "--data-dir", str(data_dir),
             "--listen", "127.0.0.1:0", "--nats-listen", "none"],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url, token = _wait_ready(proc, data_dir, log)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        raise
    try:
        yield DSecServer(url=url, token=token, data_dir=data_dir, log=log, proc=proc, binary=binary)
    finally:
        _stop(proc)
        # Every test killed its sandboxes: no group may be left.
        left = [g for name in ("dsec-pytest", "dsec-pytest-microvm", "dsec-pytest-vm") for g in _remove_cgroup_parent(name)]
        assert not left, f"cgroups left after the tests: {left}"
        # A daemon that did not stop cleanly may have left mounts in it:
        # then the directory stays for a look (rmtree would descend into
        # them).
        with open("/proc/self/mounts") as f:
            mounted = any(line.split()[1].startswith(f"{short}/") for line in f)
        if not mounted:
            shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def server(dsec_server: DSecServer) -> DSecServer:
    return dsec_server


class Conn(TypedDict):
    url: str
    token: str


@pytest.fixture
def conn(dsec_server: DSecServer) -> Conn:
    """url= and token= for the SDK."""
    return {"url": dsec_server.url, "token": dsec_server.token}


@pytest.fixture
def labels(request: pytest.FixtureRequest) -> dict[str, str]:
    """Labels unique to this test."""
    return {"libdsec-run": RUN_ID, "test": request.node.name[:60], "uid": uuid.uuid4().hex[:10]}


@pytest.fixture
def sandbox(conn: Conn, labels: dict[str, str]) -> Iterator[Sandbox]:
    """A function-tier sandbox, killed after the test."""
    sb = Sandbox.create(tier="function", metadata=labels, **conn)
    try:
        yield sb
    finally:
        sb.kill()


def pytest_terminal_summary(terminalreporter: TerminalReporter, exitstatus: int) -> None:
    if exitstatus != 0 and _server_log:
        terminalreporter.section("dsec up log (tail)")
        terminalreporter.write_line(_tail(_server_log[-1]))
