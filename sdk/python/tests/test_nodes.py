"""Node: list, cordon, drain and uncordon against a real server."""

from __future__ import annotations

import asyncio

import pytest

from libdsec import AsyncNode, Client, InvalidArgumentError, Node, NotFoundError, Sandbox, ServerError

from conftest import Conn


def test_cordon_drain_uncordon(conn: Conn, labels: dict[str, str]) -> None:
    nodes = Node.list(**conn)
    assert len(nodes) == 1
    node = nodes[0]
    assert node.ready and "function" in node.tiers and not node.cordoned
    assert node.started_at is not None and node.last_seen is not None
    try:
        got = Node.cordon(node.id, **conn)
        assert got.cordoned and not got.draining
        # The only node takes no new sandbox.
        with Client(max_retries=0, **conn) as raw, pytest.raises(ServerError) as e:
            Sandbox.create(tier="function", metadata=labels, client=raw)
        assert e.value.code == "capacity_exhausted"
        got = Node.drain(node.id, deadline_s=3600, **conn)
        assert got.cordoned and got.draining and got.drain_deadline is not None
        assert [n.draining for n in Node.list(**conn)] == [True]
    finally:
        got = Node.uncordon(node.id, **conn)
    assert not got.cordoned and not got.draining
    with Sandbox.create(tier="function", metadata=labels, **conn) as sb:
        assert sb.is_running()


def test_node_errors(conn: Conn) -> None:
    with pytest.raises(NotFoundError) as e:
        Node.cordon("no-such-node", **conn)
    assert e.value.code == "node_not_found"
    with pytest.raises(InvalidArgumentError):
        Node.drain("x", deadline_s=-1, **conn)
    with pytest.raises(InvalidArgumentError):
        Node.cordon("", **conn)


def test_async_nodes(conn: Conn) -> None:
    async def run() -> None:
        nodes = await AsyncNode.list(**conn)
        assert len(nodes) == 1
        try:
            assert (await AsyncNode.cordon(nodes[0].id, **conn)).cordoned
        finally:
            assert not (await AsyncNode.uncordon(nodes[0].id, **conn)).cordoned

    asyncio.run(run())
