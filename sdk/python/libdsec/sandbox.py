"""Sandbox: a DSec sandbox, synchronously."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Iterable, Iterator, List, Mapping, Sequence

from . import _ops
from ._http import Client, wrap_transport
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
from .commands import Commands
from .errors import InvalidArgumentError
from .files import Files

__all__ = ["Sandbox"]


def _client(client: Client | None, url: str | None, token: str | None) -> Client:
    if client is None:
        return Client.shared(url, token)
    if url is not None or token is not None:
        raise InvalidArgumentError("pass either client= or url=/token=, not both")
    return client


class Sandbox:
    """A DSec sandbox.

    Make one with :meth:`create` (or attach to one with :meth:`connect`), run
    commands with ``sandbox.commands`` and use files with ``sandbox.files``.
    As a context manager it kills the sandbox on exit. ``tier`` picks the
    substrate ("function", "container", "microvm", "vm"); every other call
    is the same on every tier.

    Safe for use from many threads.
    """

    def __init__(self, info: SandboxInfo, *, client: Client, request_timeout: float | None = None) -> None:
        self._info = info
        self._client = client
        self._rt = request_timeout or client.options.request_timeout
        self.commands = Commands(client, info.id, self._rt)
        self.files = Files(client, info.id, self._rt)
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
        return f"Sandbox(sandbox_id={self.sandbox_id!r}, tier={self.tier!r})"

    @classmethod
    def create(
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
        client: Client | None = None,
    ) -> Sandbox:
        """Create a sandbox and wait until it runs.

        Args:
            tier: "function", "container", "microvm" or "vm"; default
                "function" (the server's), or the snapshot's with
                ``from_snapshot``.
            image: image name[:tag] or ID; default: the tier's default image.
            layers: the image's layers inline instead of ``image``: a mapping
                {role: ref} such as ``{"base": ..., "workspace": ...,
                "toolkit": ...}`` (those three first, then the rest as
                given) or a list of (role, ref), bottom first; refs are
                name:version or layer IDs.
            timeout: time to live in seconds (extend it with set_timeout).
            cpu, memory_mb, disk_mb: resources; server defaults if None.
            network: the network policy (container and VM tiers): an egress
                mode, "none" (the default: no network), "allowlist" or
                "open", or a mapping ``{"egress": ..., "allow": [rule, ...]}``
                whose rules are ``{"cidr": "203.0.113.0/24"}`` or ``{"host":
                "pypi.org"}``, optionally with ``"proto": "tcp"`` or ``"udp"``
                and ``"ports": "443"`` or ``"8000-8100"``. Whatever it says,
                a sandbox never reaches the node, other sandboxes or
                metadata addresses, and private ranges only when a rule
                names them. A bad policy raises InvalidArgumentError (code
                ``invalid_network_policy``); egress on the function tier
                raises UnsupportedError (``tier_has_no_network``).
            phases: the task's phases, in order, each a mapping with a
                ``name`` and its permissions: ``network`` (as above),
                ``writable`` (absolute paths; the rest of the root is
                read-only; omitted: all writable, ``[]``: nothing),
                ``user`` ("root", "1000" or "1000:1000"), ``cpu`` and
                ``memory_mb``, ``capabilities`` (Linux capabilities of the
                phase's commands, e.g. ``["net_bind_service"]``; default
                none) and ``executables`` (absolute paths or ``"/dir/*"``:
                the only programs that may run, any other exec is killed and
                audited; omitted: any). The sandbox starts in the first;
                set_phase moves it on. With phases, ``network`` is per phase.
            capabilities: container tier: Linux capabilities of commands
                (without phases) and the most any phase may grant; default
                none (with phases: the union of theirs).
            envs: environment for every command.
            metadata: labels to filter on in list() (``labels=`` is an alias).
            url, token: the server; defaults from $DSEC_URL / $DSEC_TOKEN or
                the local ``dsec up``.
            request_timeout: timeout of each API request (default 30 s).
            trajectory: record every state-changing call to the trajectory
                of this ID ("run-42/task-7/rollout-3": letters, digits and
                ``-_./:``), in order, before the API answers; read it with
                ``client.trajectories``, rebuild it with :meth:`resume`.
            record: record to a trajectory with a generated name
                (``sb.trajectory``).
            secret_env: env values never logged: keys of ``envs``, or a
                mapping of secret values (merged into ``envs``). A resume
                asks for them again.
            resume_on_preempt: if the sandbox's node is lost, drained or
                reclaimed, the server resumes it elsewhere from its
                trajectory, behind the same ID (``sb.incarnation`` grows).
            from_snapshot: start from a snapshot's state (its ID) instead of
                ``image`` or ``layers``.
            request_id: an idempotency key (1–128 letters, digits and
                ``-_.:/``): a create repeated with it within a day gets the
                sandbox the first made instead of another, so the SDK
                retries it after any failure (a lost answer, a server that
                went away), on another server too. The same key with other
                arguments raises ConflictError (``request_id_reused``).
            client: an explicit :class:`Client` instead of the shared pool.
        """
        c = _client(client, url, token)
        body = _ops.create_body(
            tier=tier, image=image, timeout=timeout, cpu=cpu, memory_mb=memory_mb,
            disk_mb=disk_mb, envs=envs, metadata=metadata, labels=labels, layers=layers,
            network=network, phases=phases, capabilities=capabilities, trajectory=trajectory,
            record=record, secret_env=secret_env, resume_on_preempt=resume_on_preempt,
            from_snapshot=from_snapshot, request_id=request_id,
        )
        rt = request_timeout or c.options.request_timeout
        info = c.run(_ops.create_sandbox(body, rt))
        return cls(info, client=c, request_timeout=rt)

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        url: str | None = None,
        token: str | None = None,
        request_timeout: float | None = None,
        *,
        client: Client | None = None,
    ) -> Sandbox:
        """Attach to a running sandbox; NotFoundError if it is gone."""
        c = _client(client, url, token)
        rt = request_timeout or c.options.request_timeout
        return cls(c.run(_ops.connect_sandbox(sandbox_id, rt)), client=c, request_timeout=rt)

    @classmethod
    def list(
        cls,
        metadata: Mapping[str, str] | None = None,
        state: str | None = None,
        tier: str | None = None,
        limit: int | None = None,
        url: str | None = None,
        token: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        client: Client | None = None,
    ) -> List[SandboxInfo]:
        """All sandboxes matching every label in metadata, and state and tier.

        Newest first. Follows the pages to the end; ``limit`` is the page size.
        """
        c = _client(client, url, token)
        params = _ops.list_params(
            metadata=metadata, labels=labels, state=state, tier=tier, limit=limit, page_token=None
        )
        return c.run(_ops.list_sandboxes(params, c.options.request_timeout))

    @classmethod
    def list_page(
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
        client: Client | None = None,
    ) -> tuple[List[SandboxInfo], str | None]:
        """One page of list(): (items, next_page_token or None)."""
        c = _client(client, url, token)
        params = _ops.list_params(
            metadata=metadata, labels=labels, state=state, tier=tier, limit=limit,
            page_token=page_token,
        )
        return c.run(_ops.list_sandboxes_page(params, c.options.request_timeout))

    @classmethod
    def resume(
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
        client: Client | None = None,
    ) -> Sandbox:
        """Rebuild a rollout in a new sandbox from its trajectory, and
        return that sandbox; ``.resume_result`` says what the replay did
        (steps ``replayed`` and ``skipped``, the ``divergence``).

        The sandbox is made from the logged spec, starting from the
        trajectory's latest snapshot (unless ``from_scratch``), and the
        logged steps that changed state are replayed in order; pure ones
        are skipped. A replayed step whose result differs from the log
        stops the replay there, keeping the sandbox (``on_divergence=
        "stop"``, the default), or is reported and passed
        (``"continue"``). ``secret_env`` gives the values of the create's
        secret env again (InvalidArgumentError, code
        ``secret_env_missing``, without them); ``tier`` resumes on another
        tier that can. A trajectory that a running sandbox records to is
        ConflictError (``trajectory_running``); an unknown one
        NotFoundError (``trajectory_not_found``).
        """
        c = _client(client, url, token)
        body = _ops.resume_body(secret_env, on_divergence, tier, from_scratch, timeout)
        rt = request_timeout or c.options.request_timeout
        res = c.run(_ops.resume_trajectory(trajectory_id, body, rt))
        sb = cls(res.sandbox, client=c, request_timeout=rt)
        sb.resume_result = res
        return sb

    @classmethod
    def kill_by_id(
        cls, sandbox_id: str, url: str | None = None, token: str | None = None, *, client: Client | None = None
    ) -> bool:
        """Destroy a sandbox by ID: True if destroyed, False if it did not exist."""
        c = _client(client, url, token)
        return c.run(_ops.kill_sandbox(sandbox_id, c.options.request_timeout))

    def get_info(self) -> SandboxInfo:
        """Fetch the sandbox's current description."""
        self._info = self._client.run(_ops.get_sandbox(self.sandbox_id, self._rt))
        return self._info

    def is_running(self) -> bool:
        return self._client.run(_ops.is_running(self.sandbox_id, self._rt))

    def stats(self) -> SandboxStats:
        """The sandbox's resource use now, and the limits it hit.

        Measured by its node from outside the sandbox. NotFoundError if it
        is gone (SandboxNotRunningError once it has ended).
        """
        return self._client.run(_ops.sandbox_stats(self.sandbox_id, self._rt))

    def events(self, skip: int = 0, limit: int | None = None) -> List[AuditEvent]:
        """What the node's eBPF monitor saw in the sandbox, oldest first: execs
        and watched system calls with their verdicts and the rules they hit
        (e.g. ``mount``, ``test-tampering``, ``metadata-connect``). Works
        after the sandbox ended too.

        All the events after the first ``skip`` are returned, or at most
        ``limit``; the SDK asks for them in pages of 1,000 (the server's
        page), so a busy sandbox's events come whole."""
        return self._client.run(_ops.audit_events(self.sandbox_id, skip, limit, self._rt))

    def follow_events(self, skip: int = 0) -> Iterator[AuditEvent]:
        """Iterate over the sandbox's audit events as they happen: those
        after ``skip`` first, then each new one as the node's monitor sees
        it. The iteration ends shortly after the sandbox has ended; break
        out of it to stop earlier."""
        call = _ops.follow_events_call(self.sandbox_id, skip)
        resp = self._client.send(call, stream=True)
        try:
            with wrap_transport(call.what):
                for line in resp.iter_lines():
                    e = _ops.audit_event_line(line)
                    if e is not None:
                        yield e
        finally:
            resp.close()

    def integrity(self) -> IntegrityReport:
        """The rollout's integrity report: the ``phases`` it went through,
        audit ``rules`` hit with counts, ``by_severity``, ``denied``
        actions, ``suspicious`` (a high or critical rule was hit),
        ``monitored`` (never on the VM tiers: the node's monitor does not see
        inside a guest), ``sealed_grading`` and the ``grades``, and
        ``guest_enforced``: the parts of the phases the sandbox's guest
        applied itself rather than the host (``writable``, ``user``,
        ``capabilities``, ``processes`` on the VM tiers; empty on container).
        See :class:`IntegrityReport`."""
        return self._client.run(_ops.integrity(self.sandbox_id, self._rt))

    def grade(
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
        return self._client.run(
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

    def set_phase(self, phase: str, *, back: bool = False) -> SandboxInfo:
        """Move the sandbox to another of its phases. Every process of the
        current phase ends first; then the new phase's network, writable
        paths, user and limits apply. Going back to an earlier phase needs
        ``back=True`` (ConflictError, code ``phase_backwards``, otherwise).
        """
        self._info = self._client.run(_ops.set_phase(self.sandbox_id, phase, back, self._rt))
        return self._info

    def set_timeout(self, timeout: int) -> SandboxInfo:
        """Make the sandbox expire ``timeout`` seconds from now."""
        self._info = self._client.run(_ops.set_timeout(self.sandbox_id, timeout, self._rt))
        return self._info

    def snapshot(self) -> Snapshot:
        """Store the sandbox's writable state as a snapshot and return it.
        The sandbox keeps running. ``Sandbox.create(from_snapshot=s.id)``
        starts new sandboxes from it; a recorded sandbox logs it as a step,
        and a resume then replays only the steps after it."""
        return self._client.run(_ops.snapshot_sandbox(self.sandbox_id, self._rt))

    def fork(
        self,
        count: int = 1,
        *,
        timeout: int | None = None,
        labels: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Forked[Sandbox]:
        """Start ``count`` sandboxes from this one's current state, through
        one snapshot, and return them in order (a list, whose
        ``.snapshot`` is that snapshot). The parent keeps running. Each
        child gets the parent's spec and phase, ``timeout`` and ``labels``
        (``metadata=`` is an alias) if given, and, if the parent records a
        trajectory, one of its own that names the parent's. All or
        nothing: if one child cannot be made, none is kept. A count the
        server does not allow is InvalidArgumentError (code
        ``invalid_fork_count``)."""
        merged = {**(labels or {}), **(metadata or {})} if labels is not None or metadata is not None else None
        body = _ops.fork_body(count, timeout, merged)
        res = self._client.run(_ops.fork_sandbox(self.sandbox_id, body, self._rt))
        return Forked([type(self)(info, client=self._client, request_timeout=self._rt) for info in res.sandboxes], res)

    def kill(self) -> bool:
        """Destroy the sandbox: True if destroyed, False if it did not exist."""
        return self._client.run(_ops.kill_sandbox(self.sandbox_id, self._rt))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.kill()
        except Exception:
            # Do not hide the error that ended the block behind a failed kill.
            if exc_type is None:
                raise
