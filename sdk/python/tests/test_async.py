"""AsyncSandbox against a real `dsec up`.

Each test runs its own event loop with asyncio.run, so the suite needs no
pytest plugin.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Awaitable, Callable

import pytest
from conftest import Conn

from libdsec import (
    AsyncClient,
    AsyncSandbox,
    CommandExitError,
    InvalidArgumentError,
    NotFoundError,
    Sandbox,
    UnsupportedError,
)

CONCURRENT = 200


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    async def wrapper() -> Any:
        try:
            return await main()
        finally:
            await AsyncClient.aclose_shared()

    return asyncio.run(wrapper())


def test_async_basics(conn: Conn, labels: dict[str, str], tmp_path: Any) -> None:
    async def main() -> None:
        async with await AsyncSandbox.create(tier="function", metadata=labels, envs={"X": "1"}, **conn) as sb:
            info = await sb.get_info()
            assert info.state == "running" and info.labels == labels and await sb.is_running()
            assert [s.id for s in await AsyncSandbox.list(metadata=labels, **conn)] == [sb.sandbox_id]
            items, token = await AsyncSandbox.list_page(metadata=labels, limit=1, **conn)
            assert [s.id for s in items] == [sb.sandbox_id] and token is None

            r = await sb.commands.run(["echo", "hi"])
            assert r.stdout == "hi\n" and r.exit_code == 0
            assert "X=1" in (await sb.commands.run(["env"])).stdout.splitlines()
            assert (await sb.commands.run(["cat"], stdin="in")).stdout == "in"
            with pytest.raises(CommandExitError) as ei:
                await sb.commands.run(["exit", "4"])
            assert ei.value.exit_code == 4

            sync_chunks: list[str] = []
            async_chunks: list[str] = []

            async def on_err(s: str) -> None:
                async_chunks.append(s)

            text = "".join(f"{i}\n" for i in range(100))
            r = await sb.commands.run(["cat"], stdin=text, on_stdout=sync_chunks.append, on_stderr=on_err)
            assert "".join(sync_chunks) == text == r.stdout and async_chunks == []

            with pytest.raises(UnsupportedError, match="function"):
                await sb.commands.run(["sleep", "1"], background=True)

            await sb.files.write("d/x.txt", "async text")
            assert await sb.files.read("d/x.txt") == "async text"
            assert await sb.files.read("d/x.txt", format="bytes") == b"async text"
            assert [e.name for e in await sb.files.list("d")] == ["x.txt"]
            assert await sb.files.exists("d/x.txt") and (await sb.files.get_info("d/x.txt")).size == 10
            assert await sb.files.make_dir("e") is True and await sb.files.make_dir("e") is False
            await sb.files.rename("d/x.txt", "e/y.txt")
            assert await sb.files.read("e/y.txt") == "async text"
            await sb.files.remove("e", recursive=True)
            assert not await sb.files.exists("e")
            with pytest.raises(InvalidArgumentError):
                await sb.files.read("../../etc/passwd")

            src = tmp_path / "up.bin"
            src.write_bytes(b"ab" * (3 << 20))
            assert (await sb.files.upload(src, "up.bin")).size == 6 << 20
            n = 0
            async for chunk in await sb.files.read("up.bin", format="stream"):
                n += len(chunk)
            assert n == 6 << 20
            async with await sb.files.read("up.bin", format="stream") as stream:
                assert len(await stream.__anext__()) > 0
            dst = tmp_path / "down.bin"
            assert await sb.files.download("up.bin", dst) == 6 << 20
            assert dst.read_bytes() == src.read_bytes()

            new = await sb.set_timeout(900)
            assert new.expires_at is not None and info.expires_at is not None
            assert new.expires_at > info.expires_at
            sid = sb.sandbox_id
        # The context manager killed it.
        with pytest.raises(NotFoundError):
            await AsyncSandbox.connect(sid, **conn)
        assert await AsyncSandbox.kill_by_id(sid, **conn) in (True, False)
        assert await AsyncSandbox.kill_by_id("sb-does-not-exist-0000", **conn) is False

    run(main)


def test_async_context_manager_kills_on_error(conn: Conn, labels: dict[str, str]) -> None:
    sid = ""

    async def main() -> None:
        nonlocal sid
        async with await AsyncSandbox.create(tier="function", metadata=labels, **conn) as sb:
            sid = sb.sandbox_id
            raise KeyError("boom")

    with pytest.raises(KeyError):
        run(main)
    with pytest.raises(NotFoundError):
        Sandbox.connect(sid, **conn)


def test_many_concurrent_sandboxes(conn: Conn, labels: dict[str, str]) -> None:
    """≥ 200 function-tier sandboxes at once, each running a command and a
    file round trip, all killed at the end."""
    run_labels = {**labels, "batch": uuid.uuid4().hex[:8]}

    async def main() -> float:
        made: list[AsyncSandbox] = []

        async def one(i: int) -> None:
            sb = await AsyncSandbox.create(
                tier="function", timeout=300, memory_mb=64, disk_mb=16, metadata=run_labels, **conn
            )
            made.append(sb)
            token = f"sandbox-{i}-{uuid.uuid4().hex}"
            r = await sb.commands.run(["echo", token])
            assert r.stdout == token + "\n", (i, r)
            await sb.files.write(f"out/{i}.txt", token)
            got = await sb.files.read(f"out/{i}.txt")
            assert got == token, (i, got)

        t0 = time.monotonic()
        try:
            results = await asyncio.gather(*(one(i) for i in range(CONCURRENT)), return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            assert not failures, f"{len(failures)} of {CONCURRENT} failed; first: {failures[0]!r}"
            assert len(made) == CONCURRENT and len({s.sandbox_id for s in made}) == CONCURRENT
        finally:
            killed = await asyncio.gather(*(s.kill() for s in made), return_exceptions=True)
        elapsed = time.monotonic() - t0
        assert all(k is True for k in killed), [k for k in killed if k is not True][:3]
        left = await AsyncSandbox.list(metadata=run_labels, state="running", **conn)
        assert left == [], f"{len(left)} sandboxes still running"
        return elapsed

    elapsed = run(main)
    print(f"\n{CONCURRENT} concurrent function sandboxes (create, exec, write, read, kill): {elapsed:.2f}s")
    assert elapsed < 120, f"{CONCURRENT} concurrent sandboxes took {elapsed:.1f}s"
