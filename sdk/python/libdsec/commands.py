"""sandbox.commands: run commands, in the foreground or the background."""

from __future__ import annotations

import inspect
from typing import Any, Awaitable, Callable, Iterable, List, Literal, Mapping, Union, overload

from . import _ops
from ._http import AsyncClient, Client, wrap_transport
from ._models import CommandResult, ProcessInfo

__all__ = ["Commands", "CommandHandle", "AsyncCommands", "AsyncCommandHandle", "OutputHandler", "AsyncOutputHandler"]

OutputHandler = Callable[[str], Any]
# Async callbacks may also be coroutine functions.
AsyncOutputHandler = Callable[[str], Union[Any, Awaitable[Any]]]


def _deliver(result: CommandResult, on_stdout: OutputHandler | None, on_stderr: OutputHandler | None) -> List[Any]:
    """Hand a background command's whole output to its callbacks."""
    out = []
    if on_stdout and result.stdout:
        out.append(on_stdout(result.stdout))
    if on_stderr and result.stderr:
        out.append(on_stderr(result.stderr))
    return out


class CommandHandle:
    """A background command (``commands.run(..., background=True)``).

    The API has no live output for background processes: callbacks given to
    run() receive the whole output once, when wait() returns.
    """

    def __init__(
        self,
        client: Client,
        sandbox_id: str,
        pid: int,
        request_timeout: float,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
    ) -> None:
        self._client = client
        self._sandbox_id = sandbox_id
        self._pid = pid
        self._rt = request_timeout
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr

    @property
    def pid(self) -> int:
        return self._pid

    def __repr__(self) -> str:
        return f"CommandHandle(sandbox_id={self._sandbox_id!r}, pid={self._pid})"

    def wait(self, timeout: float | None = None) -> CommandResult:
        """Wait for the command to end and return its result.

        Raises CommandExitError if it exited non-zero, TimeoutError if it
        timed out or if ``timeout`` seconds passed first (it keeps running).
        """
        result = self._client.run(_ops.wait_process(self._sandbox_id, self._pid, timeout, self._rt))
        _deliver(result, self._on_stdout, self._on_stderr)
        return _ops.check_result(result)

    def info(self) -> ProcessInfo:
        return self._client.run(_ops.get_process(self._sandbox_id, self._pid, self._rt))

    def kill(self, signal: str = "KILL") -> bool:
        """Signal the command (default KILL); False if it no longer exists."""
        return self._client.run(_ops.kill_process(self._sandbox_id, self._pid, signal, self._rt))

    def send_stdin(self, data: str | bytes) -> None:
        self._client.run(_ops.send_stdin(self._sandbox_id, self._pid, data, self._rt))

    def close_stdin(self) -> None:
        self._client.run(_ops.close_stdin(self._sandbox_id, self._pid, self._rt))


class Commands:
    """Commands in one sandbox (``sandbox.commands``)."""

    def __init__(self, client: Client, sandbox_id: str, request_timeout: float) -> None:
        self._client = client
        self._sandbox_id = sandbox_id
        self._rt = request_timeout

    @overload
    def run(
        self,
        cmd: str | Iterable[str],
        background: Literal[False] = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = 60,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
        request_timeout: float | None = None,
    ) -> CommandResult: ...

    @overload
    def run(
        self,
        cmd: str | Iterable[str],
        background: Literal[True],
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = 60,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
        request_timeout: float | None = None,
    ) -> CommandHandle: ...

    def run(
        self,
        cmd: str | Iterable[str],
        background: bool = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = 60,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
        request_timeout: float | None = None,
    ) -> CommandResult | CommandHandle:
        """Run a command.

        ``cmd`` is a command line (str; split into words on tiers without a
        shell) or an argv list. It runs in ``cwd`` (absolute, or relative to
        /workspace), by default in /workspace, the directory relative file
        paths lead to as well, on every tier. With ``on_stdout`` or
        ``on_stderr`` the output is streamed to the callbacks as it arrives.
        ``timeout`` bounds the command (None: the server's default, 60 s);
        ``request_timeout`` the HTTP request (default: timeout plus the
        sandbox's request timeout).

        Returns the CommandResult, or a CommandHandle if ``background``.
        Raises CommandExitError on a non-zero exit, TimeoutError if the
        command timed out (both carry ``.result``).
        """
        body = _ops.exec_body(
            cmd, envs=envs, cwd=cwd, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes
        )
        if background:
            info = self._client.run(_ops.start_process(self._sandbox_id, body, request_timeout or self._rt))
            return CommandHandle(self._client, self._sandbox_id, info.pid, self._rt, on_stdout, on_stderr)
        rt = _ops.exec_request_timeout(timeout, request_timeout, self._rt)
        if on_stdout is None and on_stderr is None:
            result = self._client.run(_ops.exec_command(self._sandbox_id, body, rt))
        else:
            result = self._stream(body, rt, on_stdout, on_stderr)
        return _ops.check_result(result)

    def _stream(
        self, body: dict[str, Any], rt: float, on_stdout: OutputHandler | None, on_stderr: OutputHandler | None
    ) -> CommandResult:
        call = _ops.exec_stream_call(self._sandbox_id, body, rt)
        parser = _ops.ExecStream()
        resp = self._client.send(call, stream=True)
        try:
            with wrap_transport(call.what):
                for data in resp.iter_bytes():
                    for kind, text in parser.feed(data):
                        cb = on_stdout if kind == "stdout" else on_stderr
                        if cb is not None:
                            cb(text)
        finally:
            resp.close()
        return parser.finish()

    def list(self) -> List[ProcessInfo]:
        """The sandbox's background processes."""
        return self._client.run(_ops.list_processes(self._sandbox_id, self._rt))

    def connect(self, pid: int) -> CommandHandle:
        """A handle to a running background process."""
        info = self._client.run(_ops.get_process(self._sandbox_id, pid, self._rt))
        return CommandHandle(self._client, self._sandbox_id, info.pid, self._rt)

    def kill(self, pid: int, signal: str = "KILL") -> bool:
        return self._client.run(_ops.kill_process(self._sandbox_id, pid, signal, self._rt))

    def send_stdin(self, pid: int, data: str | bytes) -> None:
        self._client.run(_ops.send_stdin(self._sandbox_id, pid, data, self._rt))

    def close_stdin(self, pid: int) -> None:
        self._client.run(_ops.close_stdin(self._sandbox_id, pid, self._rt))


async def _call(cb: AsyncOutputHandler, text: str) -> None:
    r = cb(text)
    if inspect.isawaitable(r):
        await r


class AsyncCommandHandle:
    """As :class:`CommandHandle`, with coroutines."""

    def __init__(
        self,
        client: AsyncClient,
        sandbox_id: str,
        pid: int,
        request_timeout: float,
        on_stdout: AsyncOutputHandler | None = None,
        on_stderr: AsyncOutputHandler | None = None,
    ) -> None:
        self._client = client
        self._sandbox_id = sandbox_id
        self._pid = pid
        self._rt = request_timeout
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr

    @property
    def pid(self) -> int:
        return self._pid

    def __repr__(self) -> str:
        return f"AsyncCommandHandle(sandbox_id={self._sandbox_id!r}, pid={self._pid})"

    async def wait(self, timeout: float | None = None) -> CommandResult:
        result = await self._client.run(_ops.wait_process(self._sandbox_id, self._pid, timeout, self._rt))
        for r in _deliver(result, self._on_stdout, self._on_stderr):
            if inspect.isawaitable(r):
                await r
        return _ops.check_result(result)

    async def info(self) -> ProcessInfo:
        return await self._client.run(_ops.get_process(self._sandbox_id, self._pid, self._rt))

    async def kill(self, signal: str = "KILL") -> bool:
        return await self._client.run(_ops.kill_process(self._sandbox_id, self._pid, signal, self._rt))

    async def send_stdin(self, data: str | bytes) -> None:
        await self._client.run(_ops.send_stdin(self._sandbox_id, self._pid, data, self._rt))

    async def close_stdin(self) -> None:
        await self._client.run(_ops.close_stdin(self._sandbox_id, self._pid, self._rt))


class AsyncCommands:
    """As :class:`Commands`, with coroutines; callbacks may be sync or async."""

    def __init__(self, client: AsyncClient, sandbox_id: str, request_timeout: float) -> None:
        self._client = client
        self._sandbox_id = sandbox_id
        self._rt = request_timeout

    @overload
    async def run(
        self,
        cmd: str | Iterable[str],
        background: Literal[False] = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = 60,
        on_stdout: AsyncOutputHandler | None = None,
        on_stderr: AsyncOutputHandler | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
        request_timeout: float | None = None,
    ) -> CommandResult: ...

    @overload
    async def run(
        self,
        cmd: str | Iterable[str],
        background: Literal[True],
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = 60,
        on_stdout: AsyncOutputHandler | None = None,
        on_stderr: AsyncOutputHandler | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
        request_timeout: float | None = None,
    ) -> AsyncCommandHandle: ...

    async def run(
        self,
        cmd: str | Iterable[str],
        background: bool = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = 60,
        on_stdout: AsyncOutputHandler | None = None,
        on_stderr: AsyncOutputHandler | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
        request_timeout: float | None = None,
    ) -> CommandResult | AsyncCommandHandle:
        """As :meth:`Commands.run`."""
        body = _ops.exec_body(
            cmd, envs=envs, cwd=cwd, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes
        )
        if background:
            info = await self._client.run(_ops.start_process(self._sandbox_id, body, request_timeout or self._rt))
            return AsyncCommandHandle(self._client, self._sandbox_id, info.pid, self._rt, on_stdout, on_stderr)
        rt = _ops.exec_request_timeout(timeout, request_timeout, self._rt)
        if on_stdout is None and on_stderr is None:
            result = await self._client.run(_ops.exec_command(self._sandbox_id, body, rt))
        else:
            result = await self._stream(body, rt, on_stdout, on_stderr)
        return _ops.check_result(result)

    async def _stream(
        self,
        body: dict[str, Any],
        rt: float,
        on_stdout: AsyncOutputHandler | None,
        on_stderr: AsyncOutputHandler | None,
    ) -> CommandResult:
        call = _ops.exec_stream_call(self._sandbox_id, body, rt)
        parser = _ops.ExecStream()
        resp = await self._client.send(call, stream=True)
        try:
            with wrap_transport(call.what):
                async for data in resp.aiter_bytes():
                    for kind, text in parser.feed(data):
                        cb = on_stdout if kind == "stdout" else on_stderr
                        if cb is not None:
                            await _call(cb, text)
        finally:
            await resp.aclose()
        return parser.finish()

    async def list(self) -> List[ProcessInfo]:
        return await self._client.run(_ops.list_processes(self._sandbox_id, self._rt))

    async def connect(self, pid: int) -> AsyncCommandHandle:
        info = await self._client.run(_ops.get_process(self._sandbox_id, pid, self._rt))
        return AsyncCommandHandle(self._client, self._sandbox_id, info.pid, self._rt)

    async def kill(self, pid: int, signal: str = "KILL") -> bool:
        return await self._client.run(_ops.kill_process(self._sandbox_id, pid, signal, self._rt))

    async def send_stdin(self, pid: int, data: str | bytes) -> None:
        await self._client.run(_ops.send_stdin(self._sandbox_id, pid, data, self._rt))

    async def close_stdin(self, pid: int) -> None:
        await self._client.run(_ops.close_stdin(self._sandbox_id, pid, self._rt))
