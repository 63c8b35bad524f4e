"""AsyncSandbox: a DSec sandbox, for asyncio."""

from __future__ import annotations

from types import TracebackType
from typing import Any, AsyncIterator, Iterable, Iterator, List, Mapping, Sequence

from . import _ops
from ._http import AsyncClient, wrap_transport
from ._models import (
    AuditEvent,
    Divergence,
    Forked,
    GradeResult,
    IntegrityReport,
    ResumeResult,
    SandboxInfo,
    SandboxStats,
    Snapshot,
)
from ._ops import LayersSpec, NetworkSpec, SecretEnvSpec
from .commands import AsyncCommands
from .errors import InvalidArgumentError
from .files import AsyncFiles

__all__ = ["AsyncSandbox"]


def _client(client: AsyncClient | None, url: str | None, token: str | None) -> AsyncClient:
    if client is None:
        return AsyncClient.shared(url, token)
    if url is not None or token is not None:
        raise InvalidArgumentError("pass either client= or url=/token=, not both")
    return client


class AsyncSandbox:
    """As :class:`~libdsec.Sandbox`, with coroutines: ``await AsyncSandbox.create(...)``,
    ``await sb.commands.run(...)``, ``async with await AsyncSandbox.create(...) as sb``.

    Sandboxes of one (url, token) share an :class:`AsyncClient` per event
    loop; ``await AsyncClient.aclose_shared()`` closes it.
    """

    def __init__(self, info: SandboxInfo, *, client: AsyncClient, request_timeout: float | None = None) -> None:
        self._info = info
        self._client = client
        self._rt = request_timeout or client.options.request_timeout
        self.commands = AsyncCommands(client, info.id, self._rt)
        self.files = AsyncFiles(client, info.id, self._rt)
        # What the replay did, for a sandbox made by resume(); else None.
        self.resume_result: ResumeResult | None = None

    @property
    def sandbox_id(self) -> str:
        return self._info.id

    @property
    def tier(self) -> str:
        return self._info.tier

    @property
    def trajectory(self) -> str:
        """The trajectory the sandbox records to ("" for none)."""
        return self._info.trajectory

    @property
    def incarnation(self) -> int:
        """The sandboxes that have been this one: 1, plus one per resume
        (as last seen; refresh with get_info())."""
        return self._info.incarnation

    @property
    def divergence(self) -> Divergence | None:
        """Where a resume's replay stopped matching the log, or None."""
        return self._info.divergence

    def __repr__(self) -> str:
        return f"AsyncSandbox(sandbox_id={self.sandbox_id!r}, tier={self.tier!r})"

    @classmethod
    async def create(
        cls,
        tier: str | None = None,
        image: str | None = None,
        timeout: int | None = 300,
        cpu: float | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        envs: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        url: str | None = None,
        token: str | None = None,
        request_timeout: float | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        layers: LayersSpec | None = None,
        network: NetworkSpec | None = None,
        phases: Iterable[Mapping[str, Any]] | None = None,
        capabilities: Iterable[str] | None = None,
        trajectory: str | None = None,
        record: bool = False,
        secret_env: SecretEnvSpec | None = None,
        resume_on_preempt: bool = False,
        from_snapshot: str | None = None,
        request_id: str | None = None,
        client: AsyncClient | None = None,
    ) -> AsyncSandbox:
        """As :meth:`Sandbox.create <libdsec.Sandbox.create>`."""
        c = _client(client, url, token)
        body = _ops.create_body(
            tier=tier, image=image, timeout=timeout, cpu=cpu, memory_mb=memory_mb,
            disk_mb=disk_mb, envs=envs, metadata=metadata, labels=labels, layers=layers,
            network=network, phases=phases, capabilities=capabilities, trajectory=trajectory,
            record=record, secret_env=secret_env, resume_on_preempt=resume_on_preempt,
            from_snapshot=from_snapshot, request_id=request_id,
        )
        rt = request_timeout or c.options.request_timeout
        info = await c.run(_ops.create_sandbox(body, rt))
        return cls(info, client=c, request_timeout=rt)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        url: str | None = None,
        token: str | None = None,
        request_timeout: float | None = None,
        *,
        client: AsyncClient | None = None,
    ) -> AsyncSandbox:
        c = _client(client, url, token)
        rt = request_timeout or c.options.request_timeout
        return cls(await c.run(_ops.connect_sandbox(sandbox_id, rt)), client=c, request_timeout=rt)

    @classmethod
    async def list(
        cls,
        metadata: Mapping[str, str] | None = None,
        state: str | None = None,
        tier: str | None = None,
        limit: int | None = None,
        url: str | None = None,
        token: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        client: AsyncClient | None = None,
    ) -> List[SandboxInfo]:
        c = _client(client, url, token)
        params = _ops.list_params(
            metadata=metadata, labels=labels, state=state, tier=tier, limit=limit, page_token=None
        )
        return await c.run(_ops.list_sandboxes(params, c.options.request_timeout))

    @classmethod
    async def list_page(
        cls,
        metadata: Mapping[str, str] | None = None,
        state: str | None = None,
        tier: str | None = None,
        limit: int | None = None,
        page_token: str | None = None,
        url: str | None = None,
        token: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        client: AsyncClient | None = None,
    ) -> tuple[List[SandboxInfo], str | None]:
        c = _client(client, url, token)
        params = _ops.list_params(
            metadata=metadata, labels=labels, state=state, tier=tier, limit=limit,
            page_token=page_token,
        )
        return await c.run(_ops.list_sandboxes_page(params, c.options.request_timeout))

    @classmethod
    async def resume(
        cls,
        trajectory_id: str,
        secret_env: Mapping[str, str] | None = None,
        on_divergence: str | None = None,
        tier: str | None = None,
        from_scratch: bool = False,
        timeout: int | None = None,
        url: str | None = None,
        token: str | None = None,
        request_timeout: float | None = None,
        *,
        client: AsyncClient | None = None,
    ) -> AsyncSandbox:
        """As :meth:`Sandbox.resume <libdsec.Sandbox.resume>`."""
        c = _client(client, url, token)
        body = _ops.resume_body(secret_env, on_divergence, tier, from_scratch, timeout)
        rt = request_timeout or c.options.request_timeout
        res = await c.run(_ops.resume_trajectory(trajectory_id, body, rt))
        sb = cls(res.sandbox, client=c, request_timeout=rt)
        sb.resume_result = res
        return sb

    @classmethod
    async def kill_by_id(
        cls, sandbox_id: str, url: str | None = None, token: str | None = None, *, client: AsyncClient | None = None
    ) -> bool:
        c = _client(client, url, token)
        return await c.run(_ops.kill_sandbox(sandbox_id, c.options.request_timeout))

    async def get_info(self) -> SandboxInfo:
        self._info = await self._client.run(_ops.get_sandbox(self.sandbox_id, self._rt))
        return self._info

    async def is_running(self) -> bool:
        return await self._client.run(_ops.is_running(self.sandbox_id, self._rt))

    async def stats(self) -> SandboxStats:
        return await self._client.run(_ops.sandbox_stats(self.sandbox_id, self._rt))

    async def events(self, skip: int = 0, limit: int | None = None) -> List[AuditEvent]:
        """What the node's eBPF monitor saw in the sandbox, oldest first: execs
        and watched system calls with their verdicts and the rules they hit
        (e.g. ``mount``, ``test-tampering``, ``metadata-connect``). Works
        after the sandbox ended too. As Sandbox.events: all of them after
        ``skip``, or at most ``limit``, fetched in pages of 1,000."""
        return await self._client.run(_ops.audit_events(self.sandbox_id, skip, limit, self._rt))

    async def follow_events(self, skip: int = 0) -> AsyncIterator[AuditEvent]:
        """As Sandbox.follow_events: ``async for e in sb.follow_events()``."""
        call = _ops.follow_events_call(self.sandbox_id, skip)
        resp = await self._client.send(call, stream=True)
        try:
            with wrap_transport(call.what):
                async for line in resp.aiter_lines():
                    e = _ops.audit_event_line(line)
                    if e is not None:
                        yield e
        finally:
            await resp.aclose()

    async def integrity(self) -> IntegrityReport:
        """The rollout's integrity report: the ``phases`` it went through,
        audit ``rules`` hit with counts, ``by_severity``, ``denied``
        actions, ``suspicious`` (a high or critical rule was hit),
        ``monitored`` (never on the VM tiers: the node's monitor does not see
        inside a guest), ``sealed_grading`` and the ``grades``, and
        ``guest_enforced``: the parts of the phases the sandbox's guest
        applied itself rather than the host (``writable``, ``user``,
        ``capabilities``, ``processes`` on the VM tiers; empty on container).
        See :class:`IntegrityReport`."""
        return await self._client.run(_ops.integrity(self.sandbox_id, self._rt))

    async def grade(
        self,
        tests_layer: str,
        command: str | Sequence[str],
        *,
        report: str | None = None,
        reporter: str | None = None,
        expected_tests: int | None = None,
        carry: Sequence[str] | None = None,
        sealed: Sequence[str] | None = None,
        protected: Sequence[str] | None = None,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> GradeResult:
        """Grade the sandbox's work in a sealed sandbox and return the
        :class:`GradeResult`: a fresh sandbox from the same image with
        ``tests_layer`` (pristine tests the agent never had) on top, the
        agent's files under ``carry`` (default ``["/workspace"]``) less
        the paths the tests layer has (its copy always wins), protected
        ones (conftest.py, .pth, sitecustomize, test config, result files)
        and anything under ``sealed`` (default ``["/workspace/tests"]``),
        no network and none of the agent's processes. ``command`` must
        write a JUnit report to ``report`` (default
        ``/tmp/dsec-grade/junit.xml``) from its own process, or from one
        running the program ``reporter``; the server parses it:
        ``verdict`` is ``"passed"`` only if the grader exited 0 and every
        test ran and passed (none skipped, at least ``expected_tests``,
        exactly those the tests layer declares in ``/.dsec/tests.json``),
        and, where the node's monitor watched the grading sandbox
        (``audited``), it hit no audit rule (``grader_rules``) and no
        other process wrote the report; ``"failed"`` or ``"error"`` (the
        run cannot be trusted) otherwise, with ``reason``, per-test
        ``cases``, ``discarded`` files and the rollout's ``integrity``
        report (an :class:`IntegrityReport`). Exit 0 alone never passes.
        ``timeout`` bounds the grader's command (server default 300 s)."""
        return await self._client.run(
            _ops.grade(
                self.sandbox_id, tests_layer, command, report=report, reporter=reporter, expected_tests=expected_tests,
                carry=carry, sealed=sealed, protected=protected, envs=envs, cwd=cwd, timeout_s=timeout,
                request_timeout=self._rt,
            )
        )

    @property
    def phase(self) -> str:
        """The current phase as last seen (refresh with get_info()); "" for a
        sandbox created without phases."""
        return self._info.phase

    async def set_phase(self, phase: str, *, back: bool = False) -> SandboxInfo:
        """Move the sandbox to another of its phases. Every process of the
        current phase ends first; then the new phase's network, writable
        paths, user and limits apply. Going back to an earlier phase needs
        ``back=True`` (ConflictError, code ``phase_backwards``, otherwise).
        """
        self._info = await self._client.run(_ops.set_phase(self.sandbox_id, phase, back, self._rt))
        return self._info

    async def set_timeout(self, timeout: int) -> SandboxInfo:
        self._info = await self._client.run(_ops.set_timeout(self.sandbox_id, timeout, self._rt))
        return self._info

    async def snapshot(self) -> Snapshot:
        """As :meth:`Sandbox.snapshot <libdsec.Sandbox.snapshot>`."""
        return await self._client.run(_ops.snapshot_sandbox(self.sandbox_id, self._rt))

    async def fork(
        self,
        count: int = 1,
        *,
        timeout: int | None = None,
        labels: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Forked[AsyncSandbox]:
        """As :meth:`Sandbox.fork <libdsec.Sandbox.fork>`."""
        merged = {**(labels or {}), **(metadata or {})} if labels is not None or metadata is not None else None
        body = _ops.fork_body(count, timeout, merged)
        res = await self._client.run(_ops.fork_sandbox(self.sandbox_id, body, self._rt))
        return Forked([type(self)(info, client=self._client, request_timeout=self._rt) for info in res.sandboxes], res)

    async def kill(self) -> bool:
        return await self._client.run(_ops.kill_sandbox(self.sandbox_id, self._rt))

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.kill()
        except Exception:
            if exc_type is None:
                raise
