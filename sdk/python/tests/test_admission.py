"""Creates beyond what a node admits, through the SDK's own retries.

A `dsec up` of its own that starts one container at a time and lets three
wait at most a second: a burst of creates gets 429 ``overloaded`` with
Retry-After for most of its requests, and the SDK (async and sync, which
share their retry steps) retries them until every sandbox runs.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from conftest import RUN_ID, DSecServer, _remove_cgroup_parent, _stop, _tail, _wait_ready

from libdsec import AsyncClient, AsyncSandbox, Client, Sandbox

LABELS = {"pytest-admission": RUN_ID}


def create_answers(url: str) -> dict[str, int]:
    """The server's count of POST /v1/sandboxes answers by HTTP status."""
    out: dict[str, int] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("dsec_api_request_seconds_count{") and 'method="POST"' in line and 'route="/v1/sandboxes"' in line:
            code = re.search(r'code="(\d+)"', line)
            if code:
                out[code.group(1)] = out.get(code.group(1), 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


@pytest.fixture(scope="module")
def small_node(dsec_server: DSecServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    # The same binary as the session's server.
    binary = dsec_server.binary
    tmp = tmp_path_factory.mktemp("admission")
    short = Path(tempfile.mkdtemp(prefix="dsecad"))
    short.chmod(0o711)
    data_dir, log, config = short / "data", tmp / "dsec.log", tmp / "dsec.toml"
    config.write_text(
        "version = 1\n[node]\nmax_starts = 1\nstart_queue = 3\nstart_wait_s = 1\n"
        '[container]\nname = "dpad"\nnetwork_range = "10.83.0.0/16"\ncgroup_parent = "dsec-pytest-adm"\nnetwork_pool = 2\n'
        "[microvm]\ndisabled = true\n[vm]\ndisabled = true\n"
    )
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            [str(binary), "up", "--config", str(config), "--data-dir", str(data_dir),
             "--listen", "127.0.0.1:0", "--nats-listen", "none"],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        url, token = _wait_ready(proc, data_dir, log)
        # The image's first create mounts its layers: not part of a burst.
        with Sandbox.create(tier="container", labels=LABELS, url=url, token=token) as sb:
            sb.commands.run(["true"])
        yield {"url": url, "token": token}
    finally:
        _stop(proc)
        left = _remove_cgroup_parent("dsec-pytest-adm")
        assert not left, f"cgroups left after the tests: {left}; log:\n{_tail(log)}"
        with open("/proc/self/mounts") as f:
            assert not any(line.split()[1].startswith(f"{short}/") for line in f), "mounts left"
        shutil.rmtree(short, ignore_errors=True)


def test_async_burst_retries_overloaded(small_node: dict[str, str]) -> None:
    before = create_answers(small_node["url"])

    async def main() -> list[str]:
        async with AsyncClient(small_node["url"], small_node["token"]) as c:
            async def one() -> AsyncSandbox:
                sb = await AsyncSandbox.create(tier="container", labels=LABELS, client=c)
                r = await sb.commands.run(["true"])
                assert r.exit_code == 0
                return sb

            results = await asyncio.gather(*(one() for _ in range(40)), return_exceptions=True)
            made = [r for r in results if isinstance(r, AsyncSandbox)]
            await asyncio.gather(*(sb.kill() for sb in made))
            return [repr(r) for r in results if not isinstance(r, AsyncSandbox)]

    failures = asyncio.run(main())
    assert not failures, f"{len(failures)} of 40 creates failed after retries, first: {failures[0]}"
    after = create_answers(small_node["url"])
    answered = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    assert answered.get("201") == 40, answered
    assert answered.get("429", 0) > 0, f"no create was refused by a node admitting 4: {answered}"
    assert not [k for k in answered if k.startswith("5")], f"5xx answers: {answered}"


def test_sync_burst_retries_overloaded(small_node: dict[str, str]) -> None:
    before = create_answers(small_node["url"])
    with Client(small_node["url"], small_node["token"]) as c:
        def one(_: int) -> Sandbox:
            sb = Sandbox.create(tier="container", labels=LABELS, client=c)
            assert sb.commands.run(["true"]).exit_code == 0
            return sb

        with ThreadPoolExecutor(16) as pool:
            made = list(pool.map(one, range(16)))
        for sb in made:
            sb.kill()
    after = create_answers(small_node["url"])
    answered = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    assert answered.get("201") == 16 and answered.get("429", 0) > 0, answered
    assert not [k for k in answered if k.startswith("5")], f"5xx answers: {answered}"
