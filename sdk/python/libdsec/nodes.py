"""Node: the nodes of a DSec, and taking one out of service.

    from libdsec import Node

    for n in Node.list():
        print(n.id, n.tiers, n.cordoned)
    Node.drain("n17", deadline_s=1800)   # before maintenance
    Node.uncordon("n17")                 # back in service

``cordon`` stops placement on a node (its sandboxes run on); ``drain``
also moves its sandboxes off: those created with ``resume_on_preempt``
resume on another node from their trajectory, the others run until they
end or the deadline. ``uncordon`` undoes either. The classes only have
class methods; what they return is :class:`~libdsec.NodeInfo`.
"""

from __future__ import annotations

from typing import List

from . import _ops
from ._http import AsyncClient, Client
from ._models import NodeInfo
from .images import _async, _sync

__all__ = ["Node", "AsyncNode"]


class Node:
    """The nodes (``Node.list``, ``Node.cordon``, ``Node.drain``, ``Node.uncordon``).

    Every method takes ``url=``/``token=`` or ``client=`` as
    :meth:`Sandbox.create <libdsec.Sandbox.create>` does. An unknown node
    raises NotFoundError (``node_not_found``).
    """

    @classmethod
    def list(cls, url: str | None = None, token: str | None = None, *, client: Client | None = None) -> List[NodeInfo]:
        """Every node that has reported in."""
        c = _sync(client, url, token)
        return c.run(_ops.list_nodes(c.options.request_timeout))

    @classmethod
    def cordon(cls, node: str, url: str | None = None, token: str | None = None, *, client: Client | None = None) -> NodeInfo:
        """Place no new sandbox on node; its sandboxes run on."""
        c = _sync(client, url, token)
        return c.run(_ops.cordon_node(node, True, c.options.request_timeout))

    @classmethod
    def uncordon(cls, node: str, url: str | None = None, token: str | None = None, *, client: Client | None = None) -> NodeInfo:
        """Put node back in service (undoes cordon and drain)."""
        c = _sync(client, url, token)
        return c.run(_ops.cordon_node(node, False, c.options.request_timeout))

    @classmethod
    def drain(
        cls,
        node: str,
        deadline_s: int | None = None,
        url: str | None = None,
        token: str | None = None,
        *,
        client: Client | None = None,
    ) -> NodeInfo:
        """Cordon node and move its sandboxes off; those that cannot move end
        at the deadline (default: the server's, an hour)."""
        c = _sync(client, url, token)
        return c.run(_ops.drain_node(node, deadline_s, c.options.request_timeout))


class AsyncNode:
    """As :class:`Node`, with coroutines."""

    @classmethod
    async def list(cls, url: str | None = None, token: str | None = None, *, client: AsyncClient | None = None) -> List[NodeInfo]:
        c = _async(client, url, token)
        return await c.run(_ops.list_nodes(c.options.request_timeout))

    @classmethod
    async def cordon(cls, node: str, url: str | None = None, token: str | None = None, *, client: AsyncClient | None = None) -> NodeInfo:
        c = _async(client, url, token)
        return await c.run(_ops.cordon_node(node, True, c.options.request_timeout))

    @classmethod
    async def uncordon(cls, node: str, url: str | None = None, token: str | None = None, *, client: AsyncClient | None = None) -> NodeInfo:
        c = _async(client, url, token)
        return await c.run(_ops.cordon_node(node, False, c.options.request_timeout))

    @classmethod
    async def drain(
        cls,
        node: str,
        deadline_s: int | None = None,
        url: str | None = None,
        token: str | None = None,
        *,
        client: AsyncClient | None = None,
    ) -> NodeInfo:
        c = _async(client, url, token)
        return await c.run(_ops.drain_node(node, deadline_s, c.options.request_timeout))
