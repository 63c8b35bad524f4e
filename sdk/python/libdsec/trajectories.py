"""Trajectories and snapshots: ``client.trajectories`` and ``client.snapshots``.

A trajectory is the durable log of a rollout: every state-changing call to
a sandbox created with ``trajectory=`` (or ``record=True``), in order, with
its result and the audit events it raised. Read it here, export it as
JSONL, or rebuild the rollout with :meth:`Sandbox.resume
<libdsec.Sandbox.resume>`.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import IO, TYPE_CHECKING, AsyncIterator, Iterator, List, Union

from . import _ops
from ._http import wrap_transport
from ._models import Snapshot, Trajectory, TrajectoryStep

if TYPE_CHECKING:
    from ._http import AsyncClient, Client

__all__ = ["Trajectories", "AsyncTrajectories", "Snapshots", "AsyncSnapshots"]

# Where an export goes: a path (replaced once the export is complete) or a
# binary file-like object.
ExportTarget = Union[str, "os.PathLike[str]", IO[bytes]]


def _is_path(dest: ExportTarget) -> bool:
    return isinstance(dest, (str, os.PathLike))


def _temp_beside(path: str) -> tuple[int, str]:
    """A new temporary file in path's directory, for an atomic replace."""
    return tempfile.mkstemp(prefix=".dsec-export-", dir=os.path.dirname(os.path.abspath(path)))


class Trajectories:
    """The trajectories of a :class:`~libdsec.Client`'s token
    (``client.trajectories``)."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._rt = client.options.request_timeout

    def get(self, trajectory_id: str) -> Trajectory:
        """The trajectory's head: state, sandbox, steps, snapshots,
        incarnations. NotFoundError (code ``trajectory_not_found``) if
        there is none."""
        return self._client.run(_ops.get_trajectory(trajectory_id, self._rt))

    def list(self, limit: int | None = None) -> List[Trajectory]:
        """Every trajectory of the token, following the pages to the end
        (``limit`` is the page size)."""
        return self._client.run(_ops.list_trajectories(limit, self._rt))

    def steps(self, trajectory_id: str, after: int = 0) -> Iterator[TrajectoryStep]:
        """Iterate over the trajectory's steps after step number ``after``,
        in order, fetching them a page at a time."""
        while True:
            page, nxt = self._client.run(_ops.steps_page(trajectory_id, after, _ops.STEPS_PAGE, self._rt))
            yield from page
            if nxt is None:
                return
            after = nxt

    def export(self, trajectory_id: str, dest: ExportTarget) -> int:
        """Write every step as JSONL (one step a line, in order) to
        ``dest``, a path (replaced only once the export is complete) or a
        binary file-like object, and return the number of steps."""
        call = _ops.export_call(trajectory_id)
        resp = self._client.send(call, stream=True)
        lines = 0
        try:
            with wrap_transport(call.what):
                if not _is_path(dest):
                    out: IO[bytes] = dest  # type: ignore[assignment]
                    for chunk in resp.iter_bytes():
                        out.write(chunk)
                        lines += chunk.count(b"\n")
                    return lines
                path = os.fspath(dest)  # type: ignore[arg-type]
                fd, tmp = _temp_beside(path)
                try:
                    with os.fdopen(fd, "wb") as f:
                        for chunk in resp.iter_bytes():
                            f.write(chunk)
                            lines += chunk.count(b"\n")
                    os.chmod(tmp, 0o644)
                    os.replace(tmp, path)
                except BaseException:
                    os.unlink(tmp)
                    raise
                return lines
        finally:
            resp.close()

    def blob(self, trajectory_id: str, digest: str) -> bytes:
        """A blob of the trajectory: a long output (``StepExec.stdout_blob``,
        ``stderr_blob``) or a written file's content (``StepFile.digest``)."""
        return self._client.run(_ops.read_blob(trajectory_id, digest, self._rt))

    def delete(self, trajectory_id: str) -> bool:
        """Delete the trajectory, its steps and its blobs: True if deleted,
        False if there was none."""
        return self._client.run(_ops.delete_trajectory(trajectory_id, self._rt))


class AsyncTrajectories:
    """As :class:`Trajectories`, for an :class:`~libdsec.AsyncClient`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._rt = client.options.request_timeout

    async def get(self, trajectory_id: str) -> Trajectory:
        return await self._client.run(_ops.get_trajectory(trajectory_id, self._rt))

    async def list(self, limit: int | None = None) -> List[Trajectory]:
        return await self._client.run(_ops.list_trajectories(limit, self._rt))

    async def steps(self, trajectory_id: str, after: int = 0) -> AsyncIterator[TrajectoryStep]:
        while True:
            page, nxt = await self._client.run(_ops.steps_page(trajectory_id, after, _ops.STEPS_PAGE, self._rt))
            for s in page:
                yield s
            if nxt is None:
                return
            after = nxt

    async def export(self, trajectory_id: str, dest: ExportTarget) -> int:
        call = _ops.export_call(trajectory_id)
        resp = await self._client.send(call, stream=True)
        lines = 0
        try:
            with wrap_transport(call.what):
                if not _is_path(dest):
                    out: IO[bytes] = dest  # type: ignore[assignment]
                    async for chunk in resp.aiter_bytes():
                        # A thread, so that a slow disk does not stall the loop.
                        await asyncio.to_thread(out.write, chunk)
                        lines += chunk.count(b"\n")
                    return lines
                path = os.fspath(dest)  # type: ignore[arg-type]
                fd, tmp = _temp_beside(path)
                try:
                    with os.fdopen(fd, "wb") as f:
                        async for chunk in resp.aiter_bytes():
                            await asyncio.to_thread(f.write, chunk)
                            lines += chunk.count(b"\n")
                    os.chmod(tmp, 0o644)
                    os.replace(tmp, path)
                except BaseException:
                    os.unlink(tmp)
                    raise
                return lines
        finally:
            await resp.aclose()

    async def blob(self, trajectory_id: str, digest: str) -> bytes:
        return await self._client.run(_ops.read_blob(trajectory_id, digest, self._rt))

    async def delete(self, trajectory_id: str) -> bool:
        return await self._client.run(_ops.delete_trajectory(trajectory_id, self._rt))


class Snapshots:
    """The snapshots of a :class:`~libdsec.Client`'s token
    (``client.snapshots``); take one with ``sandbox.snapshot()``."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._rt = client.options.request_timeout

    def get(self, snapshot_id: str) -> Snapshot:
        """The snapshot; NotFoundError (code ``snapshot_not_found``) if
        there is none."""
        return self._client.run(_ops.get_snapshot(snapshot_id, self._rt))

    def delete(self, snapshot_id: str) -> bool:
        """Delete the snapshot (its layers stay while a sandbox or a
        trajectory uses them): True if deleted, False if there was none."""
        return self._client.run(_ops.delete_snapshot(snapshot_id, self._rt))


class AsyncSnapshots:
    """As :class:`Snapshots`, for an :class:`~libdsec.AsyncClient`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._rt = client.options.request_timeout

    async def get(self, snapshot_id: str) -> Snapshot:
        return await self._client.run(_ops.get_snapshot(snapshot_id, self._rt))

    async def delete(self, snapshot_id: str) -> bool:
        return await self._client.run(_ops.delete_snapshot(snapshot_id, self._rt))
