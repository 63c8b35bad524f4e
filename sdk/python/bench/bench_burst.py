#!/usr/bin/env python3
"""N container creates at once through the asyncio SDK, against a real `dsec up`.

What an RL rollout loop that starts all its sandboxes together sees:
``asyncio.gather`` of N ``AsyncSandbox.create(tier="container")``, each
followed by ``commands.run(["true"])`` in its new sandbox, with the SDK's
default retries (429, and 503 with Retry-After, honoured with jittered
backoff). It reports creates per second over the burst, the p50/p99 of one
create as the caller saw it (retries included), what the server answered
(429, 503, other 5xx: read from its /metrics before and after), the
failures the caller got, and whether every sandbox ran its command.
Every sandbox is killed afterwards.

It starts its own `dsec up` (as bench_container.py does) unless --url is
given. From the repository root:

    /usr/bin/python3 sdk/python/bench/bench_burst.py --dsec bin/dsec --burst 2000

The figures are in docs/bench.md; `dsec bench --scenarios create-burst`
is the same burst through the Go client.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

SDK_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(SDK_DIR))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_container import Conn, Server, pct, wait_image  # noqa: E402
from libdsec import AsyncClient, AsyncSandbox, SandboxError  # noqa: E402

_COUNT = re.compile(r'^dsec_api_request_seconds_count\{([^}]*)\} (\S+)$')


def create_statuses(url: str) -> dict[str, int]:
    """The server's count of POST /v1/sandboxes answers by HTTP status."""
    out: dict[str, int] = collections.Counter()
    text = httpx.get(url + "/metrics", timeout=30).text
    for line in text.splitlines():
        m = _COUNT.match(line)
        if not m or 'method="POST"' not in m.group(1) or 'route="/v1/sandboxes"' not in m.group(1):
            continue
        code = re.search(r'code="(\d+)"', m.group(1))
        if code:
            out[code.group(1)] += int(float(m.group(2)))
    return dict(out)


async def burst(conn: Conn, image: str, n: int, max_retries: int | None) -> dict[str, Any]:
    labels = {"bench-burst": uuid.uuid4().hex[:8]}
    opts: dict[str, Any] = {}
    if max_retries is not None:
        opts["max_retries"] = max_retries
    client = AsyncClient(conn["url"], conn["token"], **opts)
    lat: list[float] = []
    sandboxes: list[AsyncSandbox] = []
    failures: collections.Counter[str] = collections.Counter()
    exec_failures: collections.Counter[str] = collections.Counter()
    last = 0.0

    async def one() -> None:
        nonlocal last
        t0 = time.perf_counter()
        try:
            sb = await AsyncSandbox.create(tier="container", image=image, labels=labels, client=client)
        except SandboxError as e:
            last = max(last, time.perf_counter())
            failures[f"{e.status} {e.code}"] += 1
            return
        t1 = time.perf_counter()
        last = max(last, t1)
        lat.append(t1 - t0)
        sandboxes.append(sb)
        try:
            r = await sb.commands.run(["true"])
            if r.exit_code != 0:
                exec_failures[f"exit {r.exit_code}"] += 1
        except SandboxError as e:
            exec_failures[f"{e.status} {e.code}"] += 1

    before = create_statuses(conn["url"])
    start = time.perf_counter()
    try:
        await asyncio.gather(*(one() for _ in range(n)))
        wall = last - start
    finally:
        sem = asyncio.Semaphore(32)

        async def kill(sb: AsyncSandbox) -> None:
            async with sem:
                try:
                    await sb.kill()
                except SandboxError:
                    pass

        await asyncio.gather(*(kill(sb) for sb in sandboxes))
        await client.aclose()
    after = create_statuses(conn["url"])
    answered = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    return {
        "burst": n,
        "created": len(lat),
        "all_succeeded": len(lat) == n and not exec_failures,
        "seconds": wall,
        "creates_per_s": len(lat) / wall if wall > 0 else 0.0,
        "create_p50_ms": pct(lat, 50),
        "create_p99_ms": pct(lat, 99),
        "server_answers": answered,
        "server_5xx_other": sum(v for k, v in answered.items() if k.startswith("5") and k != "503"),
        "create_failures": dict(failures),
        "exec_failures": dict(exec_failures),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsec", default="bin/dsec", help="the dsec binary to start (default bin/dsec)")
    ap.add_argument("--url", help="measure this running server instead (with --token)")
    ap.add_argument("--token")
    ap.add_argument("--image", default="busybox")
    ap.add_argument("--burst", type=int, default=2000, help="creates at once (default 2000)")
    ap.add_argument("--max-retries", type=int, help="the SDK's max_retries (default: the SDK's)")
    ap.add_argument("--pool", type=int, default=32, help="the server's network pool (default 32)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    server = None
    if args.url:
        conn: Conn = {"url": args.url, "token": args.token or os.environ.get("DSEC_TOKEN", "")}
    else:
        server = Server(args.dsec, args.pool)
        conn = {"url": server.url, "token": server.token}
    try:
        wait_image(conn, args.image)
        res = asyncio.run(burst(conn, args.image, args.burst, args.max_retries))
    finally:
        if server:
            server.close()
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"Python SDK (AsyncSandbox) → dsec up: {res['burst']} container creates at once, image={args.image}")
        print(f"  created {res['created']} in {res['seconds']:.1f} s: {res['creates_per_s']:.0f} creates/s, "
              f"create p50 {res['create_p50_ms']:.0f} ms, p99 {res['create_p99_ms']:.0f} ms")
        print(f"  server answered: {res['server_answers']} (other 5xx: {res['server_5xx_other']})")
        print(f"  create failures after retries: {res['create_failures'] or 'none'}; "
              f"command failures: {res['exec_failures'] or 'none'}; all succeeded: {res['all_succeeded']}")
    return 0 if res["all_succeeded"] else 1


if __name__ == "__main__":
    sys.exit(main())
