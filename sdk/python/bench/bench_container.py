#!/usr/bin/env python3
"""Container-tier figures through the Python SDK, against a real `dsec up`.

Measures what an RL rollout loop sees:

- cycle: Sandbox.create(tier="container") → commands.run(["true"]) → kill,
  one at a time (sync API) and 8 at a time (asyncio, AsyncSandbox), with
  create-to-ready (create returned: the sandbox runs) apart;
- exec: commands.run(["true"]) in one running sandbox.

It starts its own `dsec up` (a temporary data directory, its own network
range, cgroup parent and name, so that it stays apart from any other DSec
on the host) unless --url is given, prints a table (or --json) and stops
the server. Run from the repository root:

    /usr/bin/python3 sdk/python/bench/bench_container.py --dsec bin/dsec

`make bench` runs it. The figures are in docs/bench.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable, TypedDict

import httpx

SDK_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(SDK_DIR))

from libdsec import AsyncSandbox, Sandbox  # noqa: E402

RUN = uuid.uuid4().hex[:8]
LABELS = {"bench": RUN}


class Conn(TypedDict):
    """Where the server is: the url= and token= of Sandbox.create."""

    url: str
    token: str


def pct(xs: list[float], p: float) -> float:
    """Nearest-rank percentile of xs (seconds) in milliseconds."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    i = min(max(int(len(s) * p / 100 + 0.999999) - 1, 0), len(s) - 1)
    return s[i] * 1000


class Server:
    """A `dsec up` on a temporary data directory, stopped on close."""

    def __init__(self, binary: str, pool: int) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="dsec-pybench-"))
        # Container sandboxes run as an unprivileged host uid that must walk
        # down to their roots in the data directory.
        self.tmp.chmod(0o711)
        data = self.tmp / "data"
        config = self.tmp / "dsec.toml"
        # The VM tiers are off: on a fresh data directory `dsec up` builds
        # their guest kernel in the background (xz, ~400 MiB of RSS for a
        # while), which would share the 2 cores with what is measured.
        config.write_text(
            "version = 1\n[container]\n"
            f'name = "dpb"\nnetwork_range = "10.87.0.0/16"\ncgroup_parent = "dsec-pybench"\nnetwork_pool = {pool}\n'
            "[microvm]\ndisabled = true\n"
        )
        self.log = self.tmp / "server.log"
        env = dict(os.environ, DSEC_SKIP_SLOW_IMAGES="true")
        with open(self.log, "wb") as logf:
            self.proc = subprocess.Popen(
                [binary, "up", "--config", str(config), "--data-dir", str(data), "--listen", "127.0.0.1:0",
                 "--nats-listen", "none", "--log-level", "warn"],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dsec up exited ({self.proc.returncode}):\n{self.log.read_text()[-4000:]}")
            addr, token = data / "api.addr", data / "token"
            if addr.is_file() and token.is_file() and addr.read_text().strip() and token.read_text().strip():
                self.url = "http://" + addr.read_text().strip()
                self.token = token.read_text().strip()
                try:
                    if httpx.get(self.url + "/v1/health", timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        self.close()
        raise RuntimeError("dsec up was not ready within 120 s")

    def rss_mib(self) -> float:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return float("nan")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        subprocess.run(["rm", "-rf", str(self.tmp)], check=False)
        # The node leaves its cgroup parent, empty, when it stops.
        for parent in list(Path("/sys/fs/cgroup").glob("*/dsec-pybench")) + [Path("/sys/fs/cgroup/dsec-pybench")]:
            try:
                parent.rmdir()
            except OSError:
                pass


def wait_image(conn: Conn, image: str) -> None:
    """The built-in images appear once their layers are built."""
    deadline = time.monotonic() + 120
    while True:
        try:
            with Sandbox.create(tier="container", image=image, metadata=LABELS, **conn) as sb:
                sb.commands.run(["true"])
            return
        except Exception as e:  # noqa: BLE001 - any failure: retry until the deadline
            if time.monotonic() > deadline:
                raise RuntimeError(f"no usable {image} container sandbox after 120 s: {e}") from e
            time.sleep(0.5)


def cycle_sync(conn: Conn, image: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    sb = Sandbox.create(tier="container", image=image, metadata=LABELS, **conn)
    t1 = time.perf_counter()
    try:
        r = sb.commands.run(["true"])
        assert r.exit_code == 0, r
    finally:
        sb.kill()
    return t1 - t0, time.perf_counter() - t0


async def cycle_async(conn: Conn, image: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    sb = await AsyncSandbox.create(tier="container", image=image, metadata=LABELS, **conn)
    t1 = time.perf_counter()
    try:
        r = await sb.commands.run(["true"])
        assert r.exit_code == 0, r
    finally:
        await sb.kill()
    return t1 - t0, time.perf_counter() - t0


async def run_parallel(n: int, conc: int, fn: Callable[[], Awaitable[tuple[float, float]]]) -> tuple[list[tuple[float, float]], float]:
    out: list[tuple[float, float]] = []
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            out.append(await fn())

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return out, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsec", default="bin/dsec", help="the dsec binary to start (default bin/dsec)")
    ap.add_argument("--url", help="measure this running server instead (with --token)")
    ap.add_argument("--token")
    ap.add_argument("--image", default="busybox")
    ap.add_argument("--cycles", type=int, default=200, help="sequential cycles (default 200)")
    ap.add_argument("--parallel", type=int, default=8, help="concurrent cycles (default 8)")
    ap.add_argument("--parallel-cycles", type=int, default=400, help="cycles at --parallel (default 400)")
    ap.add_argument("--execs", type=int, default=500, help="exec round trips (default 500)")
    ap.add_argument("--pool", type=int, default=32, help="the server's network pool (default 32)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    server = None
    if args.url:
        conn: Conn = {"url": args.url, "token": args.token or os.environ.get("DSEC_TOKEN", "")}
    else:
        server = Server(args.dsec, args.pool)
        conn = {"url": server.url, "token": server.token}
    rows: list[dict[str, Any]] = []
    rss0 = rss1 = float("nan")
    try:
        wait_image(conn, args.image)
        for _ in range(10):  # warm-up: connections, page cache, the pool's first fill
            cycle_sync(conn, args.image)
        rss0 = server.rss_mib() if server else float("nan")

        t = time.perf_counter()
        seq = [cycle_sync(conn, args.image) for _ in range(args.cycles)]
        rows.append(row("cycle", "sync", 1, seq, time.perf_counter() - t))
        for conc, n in ((1, args.cycles), (args.parallel, args.parallel_cycles)):
            out, wall = asyncio.run(run_parallel(n, conc, lambda: cycle_async(conn, args.image)))
            rows.append(row("cycle", "async", conc, out, wall))

        with Sandbox.create(tier="container", image=args.image, metadata=LABELS, **conn) as sb:
            lat, wall = timed(args.execs, lambda: sb.commands.run(["true"]))
        rows.append(row("exec", "sync", 1, [(0.0, x) for x in lat], wall))
        lat, wall = asyncio.run(exec_async(conn, args.image, args.execs))
        rows.append(row("exec", "async", 1, [(0.0, x) for x in lat], wall))
        rss1 = server.rss_mib() if server else float("nan")
    finally:
        if server:
            server.close()

    if args.json:
        print(json.dumps({"rows": rows, "server_rss_mib": [rss0, rss1]}, indent=1))
        return 0
    print(f"Python SDK (libdsec, httpx) → dsec up, tier=container, image={args.image}; ms")
    print(f"{'scenario':>8} {'api':>5} {'conc':>4} {'n':>5} {'per s':>7} {'ready p50':>9} {'ready p99':>9} {'p50':>7} {'p99':>7}")
    for r in rows:
        rp50 = f"{r['ready_p50_ms']:.2f}" if r["ready_p50_ms"] is not None else "-"
        rp99 = f"{r['ready_p99_ms']:.2f}" if r["ready_p99_ms"] is not None else "-"
        print(f"{r['scenario']:>8} {r['api']:>5} {r['concurrency']:>4} {r['n']:>5} {r['per_s']:>7.0f} {rp50:>9} {rp99:>9} "
              f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f}")
    if server:
        print(f"server RSS: {rss0:.0f} MiB after warm-up, {rss1:.0f} MiB at the end")
    return 0


def row(scenario: str, api: str, conc: int, samples: list[tuple[float, float]], wall: float) -> dict[str, Any]:
    """A table row: samples are (create-to-ready, total) in seconds."""
    ready = [s[0] for s in samples] if scenario == "cycle" else []
    total = [s[1] for s in samples]
    return {"scenario": scenario, "api": api, "concurrency": conc, "n": len(samples), "per_s": len(samples) / wall,
            "ready_p50_ms": pct(ready, 50) if ready else None, "ready_p99_ms": pct(ready, 99) if ready else None,
            "p50_ms": pct(total, 50), "p99_ms": pct(total, 99)}


def timed(n: int, fn: Callable[[], Any]) -> tuple[list[float], float]:
    for _ in range(20):
        fn()
    lat = []
    t = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t0)
    return lat, time.perf_counter() - t


async def exec_async(conn: Conn, image: str, n: int) -> tuple[list[float], float]:
    sb = await AsyncSandbox.create(tier="container", image=image, metadata=LABELS, **conn)
    try:
        for _ in range(20):
            await sb.commands.run(["true"])
        lat = []
        t = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter()
            await sb.commands.run(["true"])
            lat.append(time.perf_counter() - t0)
        return lat, time.perf_counter() - t
    finally:
        await sb.kill()


if __name__ == "__main__":
    sys.exit(main())
