"""sandbox.files: the sandbox's file system.

Paths are absolute, or relative to /workspace, the directory commands start
in, on every tier. The function tier's files API reaches only /workspace
(paths outside it are refused with InvalidArgumentError); the other tiers'
reaches the whole sandbox.
Uploads and downloads are streamed: file-like objects and local files are
never read into memory whole.
"""

from __future__ import annotations

import asyncio
import os
from types import TracebackType
from typing import IO, List, Literal, Union, overload

import httpx

from . import _ops
from ._calls import CHUNK_SIZE, BodyData
from ._http import AsyncClient, Client, wrap_transport
from ._models import EntryInfo

__all__ = ["Files", "AsyncFiles", "FileStream", "AsyncFileStream"]

StrPath = Union[str, "os.PathLike[str]"]
ReadFormat = Literal["text", "bytes", "stream"]


def _check_format(format: str) -> None:
    if format not in ("text", "bytes", "stream"):
        raise ValueError(f"format must be 'text', 'bytes' or 'stream', not {format!r}")


def _open_read(path: StrPath) -> IO[bytes]:
    return open(path, "rb")


def _open_write(path: StrPath) -> IO[bytes]:
    return open(path, "wb")


def _remove_partial(local_path: StrPath) -> None:
    try:
        os.unlink(local_path)
    except OSError:
        pass


class FileStream:
    """The content of a file, as an iterator of byte chunks (``read(format="stream")``).

    It holds a connection until it is exhausted or closed; use it in a
    ``with`` block, or call close(), if you may stop early.
    """

    def __init__(self, resp: httpx.Response, what: str) -> None:
        self._resp = resp
        self._what = what
        self._chunks = resp.iter_bytes(CHUNK_SIZE)

    def __iter__(self) -> FileStream:
        return self

    def __next__(self) -> bytes:
        try:
            with wrap_transport(self._what):
                return next(self._chunks)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._resp.close()

    def __enter__(self) -> FileStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class AsyncFileStream:
    """As :class:`FileStream`, an async iterator; close it with ``await aclose()``
    (or ``async with``) if you may stop early."""

    def __init__(self, resp: httpx.Response, what: str) -> None:
        self._resp = resp
        self._what = what
        self._chunks = resp.aiter_bytes(CHUNK_SIZE)

    def __aiter__(self) -> AsyncFileStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            with wrap_transport(self._what):
                return await self._chunks.__anext__()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        await self._resp.aclose()

    async def __aenter__(self) -> AsyncFileStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class Files:
    """Files in one sandbox (``sandbox.files``)."""

    def __init__(self, client: Client, sandbox_id: str, request_timeout: float) -> None:
        self._client = client
        self._sandbox_id = sandbox_id
        self._rt = request_timeout

    @overload
    def read(self, path: str, format: Literal["text"] = "text") -> str: ...

    @overload
    def read(self, path: str, format: Literal["bytes"]) -> bytes: ...

    @overload
    def read(self, path: str, format: Literal["stream"]) -> FileStream: ...

    def read(self, path: str, format: ReadFormat = "text") -> str | bytes | FileStream:
        """Read a file as text (UTF-8), bytes, or a stream of byte chunks.

        A stream holds a connection until it is exhausted or closed.
        """
        _check_format(format)
        if format == "stream":
            call = _ops.read_call(self._sandbox_id, path, self._rt)
            return FileStream(self._client.send(call, stream=True), call.what)
        data = self._client.run(_ops.read_file(self._sandbox_id, path, self._rt))
        return data.decode("utf-8") if format == "text" else data

    def write(
        self,
        path: str,
        data: BodyData,
        mode: int | str | None = None,
        parents: bool = True,
        request_timeout: float | None = None,
    ) -> EntryInfo:
        """Write (replace atomically) a file from str, bytes or a file-like object.

        ``mode`` is the permission bits (0o644 or "0644"; default 0644);
        ``parents`` creates missing directories.
        """
        rt = request_timeout or self._rt
        return self._client.run(_ops.write_file(self._sandbox_id, path, data, mode, parents, rt))

    def upload(
        self, local_path: StrPath, path: str, mode: int | str | None = None, parents: bool = True
    ) -> EntryInfo:
        """Upload a local file, streamed."""
        with _open_read(local_path) as f:
            return self.write(path, f, mode=mode, parents=parents)

    def download(self, path: str, local_path: StrPath) -> int:
        """Download a file to a local path, streamed; returns the bytes written."""
        call = _ops.read_call(self._sandbox_id, path, self._rt)
        resp = self._client.send(call, stream=True)
        n = 0
        try:
            f = _open_write(local_path)
        except BaseException:
            resp.close()
            raise
        try:
            with f, wrap_transport(call.what):
                for chunk in resp.iter_bytes(CHUNK_SIZE):
                    f.write(chunk)
                    n += len(chunk)
        except BaseException:
            _remove_partial(local_path)
            raise
        finally:
            resp.close()
        return n

    def list(self, path: str, depth: int = 1) -> List[EntryInfo]:
        """The entries of a directory, descending depth levels."""
        return self._client.run(_ops.list_files(self._sandbox_id, path, depth, self._rt))

    def exists(self, path: str) -> bool:
        return self._client.run(_ops.file_exists(self._sandbox_id, path, self._rt))

    def get_info(self, path: str) -> EntryInfo:
        return self._client.run(_ops.stat_file(self._sandbox_id, path, self._rt))

    def remove(self, path: str, recursive: bool = False) -> None:
        """Remove a file, or a directory (non-empty ones need recursive=True)."""
        self._client.run(_ops.remove_file(self._sandbox_id, path, recursive, self._rt))

    def make_dir(self, path: str, parents: bool = True) -> bool:
        """Make a directory; False if it already existed."""
        return self._client.run(_ops.make_dir(self._sandbox_id, path, parents, self._rt))

    def rename(self, old_path: str, new_path: str) -> EntryInfo:
        return self._client.run(_ops.rename_file(self._sandbox_id, old_path, new_path, self._rt))


class AsyncFiles:
    """As :class:`Files`, with coroutines; ``read(format="stream")`` gives an async iterator."""

    def __init__(self, client: AsyncClient, sandbox_id: str, request_timeout: float) -> None:
        self._client = client
        self._sandbox_id = sandbox_id
        self._rt = request_timeout

    @overload
    async def read(self, path: str, format: Literal["text"] = "text") -> str: ...

    @overload
    async def read(self, path: str, format: Literal["bytes"]) -> bytes: ...

    @overload
    async def read(self, path: str, format: Literal["stream"]) -> AsyncFileStream: ...

    async def read(self, path: str, format: ReadFormat = "text") -> str | bytes | AsyncFileStream:
        _check_format(format)
        if format == "stream":
            call = _ops.read_call(self._sandbox_id, path, self._rt)
            return AsyncFileStream(await self._client.send(call, stream=True), call.what)
        data = await self._client.run(_ops.read_file(self._sandbox_id, path, self._rt))
        return data.decode("utf-8") if format == "text" else data

    async def write(
        self,
        path: str,
        data: BodyData,
        mode: int | str | None = None,
        parents: bool = True,
        request_timeout: float | None = None,
    ) -> EntryInfo:
        rt = request_timeout or self._rt
        return await self._client.run(_ops.write_file(self._sandbox_id, path, data, mode, parents, rt))

    async def upload(
        self, local_path: StrPath, path: str, mode: int | str | None = None, parents: bool = True
    ) -> EntryInfo:
        f: IO[bytes] = await asyncio.to_thread(_open_read, local_path)
        try:
            return await self.write(path, f, mode=mode, parents=parents)
        finally:
            f.close()

    async def download(self, path: str, local_path: StrPath) -> int:
        call = _ops.read_call(self._sandbox_id, path, self._rt)
        resp = await self._client.send(call, stream=True)
        n = 0
        try:
            f: IO[bytes] = await asyncio.to_thread(_open_write, local_path)
        except BaseException:
            await resp.aclose()
            raise
        try:
            with f, wrap_transport(call.what):
                async for chunk in resp.aiter_bytes(CHUNK_SIZE):
                    await asyncio.to_thread(f.write, chunk)
                    n += len(chunk)
        except BaseException:
            _remove_partial(local_path)
            raise
        finally:
            await resp.aclose()
        return n

    async def list(self, path: str, depth: int = 1) -> List[EntryInfo]:
        return await self._client.run(_ops.list_files(self._sandbox_id, path, depth, self._rt))

    async def exists(self, path: str) -> bool:
        return await self._client.run(_ops.file_exists(self._sandbox_id, path, self._rt))

    async def get_info(self, path: str) -> EntryInfo:
        return await self._client.run(_ops.stat_file(self._sandbox_id, path, self._rt))

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._client.run(_ops.remove_file(self._sandbox_id, path, recursive, self._rt))

    async def make_dir(self, path: str, parents: bool = True) -> bool:
        return await self._client.run(_ops.make_dir(self._sandbox_id, path, parents, self._rt))

    async def rename(self, old_path: str, new_path: str) -> EntryInfo:
        return await self._client.run(_ops.rename_file(self._sandbox_id, old_path, new_path, self._rt))
