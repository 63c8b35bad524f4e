"""sandbox.commands against a real `dsec up` (function tier)."""

from __future__ import annotations

import builtins
import time

import pytest
from conftest import Conn

import libdsec
from libdsec import CommandExitError, CommandResult, Sandbox, UnsupportedError


def test_run_argv_and_command_line(sandbox: Sandbox) -> None:
    r = sandbox.commands.run(["echo", "hello", "world"])
    assert isinstance(r, CommandResult)
    assert (r.stdout, r.stderr, r.exit_code, r.error) == ("hello world\n", "", 0, "")
    assert r.duration_ms > 0 and not r.timed_out and not r.stdout_truncated
    # A str is a command line; the function tier splits it into words.
    assert sandbox.commands.run("echo 'quoted words' x").stdout == "quoted words x\n"
    assert sandbox.commands.run(["calc", "2+3*4"]).stdout.strip() == "14"


def test_stdin(sandbox: Sandbox) -> None:
    assert sandbox.commands.run(["cat"], stdin="line one\nline two\n").stdout == "line one\nline two\n"
    assert sandbox.commands.run(["tiny-echo"], stdin=b"bytes in").stdout == "bytes in"
    assert sandbox.commands.run(["json", ".a[1]"], stdin='{"a":[1,2]}').stdout.strip() == "2"
    big = "0123456789abcdef" * 32768  # 512 KiB (JSON request bodies are capped at 1 MiB)
    assert sandbox.commands.run(["cat"], stdin=big).stdout == big


def test_envs(conn: Conn, labels: dict[str, str]) -> None:
    with Sandbox.create(tier="function", envs={"FROM_SPEC": "s", "OVERRIDDEN": "spec"}, metadata=labels, **conn) as sb:
        lines = sb.commands.run(["env"], envs={"FROM_REQ": "r", "OVERRIDDEN": "req"}).stdout.splitlines()
        assert "FROM_SPEC=s" in lines and "FROM_REQ=r" in lines and "OVERRIDDEN=req" in lines
        assert "OVERRIDDEN=spec" not in lines


def test_exit_code_raises(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitError) as ei:
        sandbox.commands.run(["exit", "3"])
    e = ei.value
    assert e.exit_code == 3 and e.result is not None and e.result.exit_code == 3
    with pytest.raises(CommandExitError) as ei2:
        sandbox.commands.run(["cat", "/workspace/no-such-file"])
    assert ei2.value.exit_code != 0 and ei2.value.stderr


def test_timeout_raises(sandbox: Sandbox) -> None:
    t0 = time.monotonic()
    with pytest.raises(libdsec.TimeoutError) as ei:
        sandbox.commands.run(["loop"], timeout=1)
    elapsed = time.monotonic() - t0
    e = ei.value
    assert isinstance(e, builtins.TimeoutError)
    assert e.result is not None and e.result.timed_out and e.result.exit_code == -1
    assert elapsed < 20, f"a 1 s timeout took {elapsed:.1f}s"
    # The sandbox still works afterwards.
    assert sandbox.commands.run(["echo", "after"]).stdout == "after\n"


def test_output_cap(sandbox: Sandbox) -> None:
    with pytest.raises(libdsec.TimeoutError) as ei:
        sandbox.commands.run(["yes"], timeout=1, max_output_bytes=1000)
    r = ei.value.result
    assert r is not None and len(r.stdout) == 1000 and r.stdout_truncated


def test_streaming_callbacks(sandbox: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    text = "".join(f"line {i}\n" for i in range(200))
    r = sandbox.commands.run(["cat"], stdin=text, on_stdout=out.append, on_stderr=err.append)
    assert out and "".join(out) == text and r.stdout == text
    assert r.exit_code == 0 and err == []
    # stderr reaches its callback, and a failing streamed command still raises.
    with pytest.raises(CommandExitError) as ei:
        sandbox.commands.run(["cat", "/workspace/missing"], on_stdout=out.append, on_stderr=err.append)
    assert err and "".join(err) == ei.value.stderr
    # A flood is streamed in many chunks until its timeout.
    chunks: list[str] = []
    with pytest.raises(libdsec.TimeoutError) as ti:
        sandbox.commands.run(["yes"], timeout=1, max_output_bytes=100_000, on_stdout=chunks.append)
    assert "".join(chunks) == ti.value.stdout and len(ti.value.stdout) == 100_000


def test_background_unsupported_on_function(sandbox: Sandbox) -> None:
    with pytest.raises(UnsupportedError) as ei:
        sandbox.commands.run(["sleep", "5"], background=True)
    assert "function" in str(ei.value)
    assert ei.value.status == 422 and ei.value.class_ == "unsupported"
