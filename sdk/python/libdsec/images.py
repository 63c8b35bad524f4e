"""Image and Layer: compose sandbox images from layers, and build layers.

    from libdsec import Image, Layer, Sandbox

    ws = Layer.build_dir("./my-workspace", name="team/ws:1")
    base = next(l for l in Layer.list() if l.name.startswith("base/busybox:"))
    Image.create("team/py:1", base=base.name, workspace=ws.name)
    with Sandbox.create(tier="container", image="team/py:1") as sb:
        ...

A layer is a file tree the server keeps (as EROFS); an image is an ordered
list of layers with roles (base, workspace, toolkit, …), bottom first, under
a name:tag. ``Sandbox.create(layers=...)`` takes the layers inline instead
of an image name. The classes only have class methods; what they return is
:class:`~libdsec.LayerInfo` and :class:`~libdsec.ImageInfo`.
"""

from __future__ import annotations

import os
from typing import IO, Iterable, List, Union

from . import _ops
from ._calls import Body
from ._http import AsyncClient, Client
from ._models import ImageInfo, LayerInfo
from ._tar import iter_tar
from .errors import InvalidArgumentError

__all__ = ["Image", "AsyncImage", "Layer", "AsyncLayer"]

StrPath = Union[str, "os.PathLike[str]"]

# Seconds a layer upload may wait for the server between bytes, which
# includes the build that follows the upload. The transfer itself has no
# overall limit.
LAYER_TIMEOUT = 900.0


def _sync(client: Client | None, url: str | None, token: str | None) -> Client:
    if client is None:
        return Client.shared(url, token)
    if url is not None or token is not None:
        raise InvalidArgumentError("pass either client= or url=/token=, not both")
    return client


def _async(client: AsyncClient | None, url: str | None, token: str | None) -> AsyncClient:
    if client is None:
        return AsyncClient.shared(url, token)
    if url is not None or token is not None:
        raise InvalidArgumentError("pass either client= or url=/token=, not both")
    return client


def _check_dir(local_dir: StrPath) -> None:
    path = os.fspath(local_dir)
    if not os.path.isdir(path):
        what = "not a directory" if os.path.exists(path) else "no such directory"
        raise InvalidArgumentError(f"{path}: {what}", code="invalid_path")


def _tar_body(local_dir: StrPath) -> Body:
    _check_dir(local_dir)
    return Body(chunks=iter_tar(local_dir), content_type=_ops.TAR_TYPE)


def _open_archive(path_or_fileobj: StrPath | IO[bytes]) -> tuple[IO[bytes], bool]:
    """The archive to upload, and whether it was opened here (to close it)."""
    if hasattr(path_or_fileobj, "read"):
        return path_or_fileobj, False  # type: ignore[return-value]
    if not isinstance(path_or_fileobj, (str, os.PathLike)):
        raise InvalidArgumentError(f"expected a path or a binary file object, not {type(path_or_fileobj).__name__}")
    path = os.fspath(path_or_fileobj)
    if os.path.isdir(path):
        raise InvalidArgumentError(f"{path} is a directory: use Layer.build_dir", code="invalid_path")
    return open(path, "rb"), True


class Layer:
    """Layers on the server (``Layer.build_dir``, ``Layer.upload``, ``Layer.list``, …).

    Every method takes ``url=``/``token=`` or ``client=`` as
    :meth:`Sandbox.create <libdsec.Sandbox.create>` does. References are
    name:version (names may contain '/', e.g. ``toolkit/wasm-tools:…``) or
    layer IDs (``sha256:…``).
    """

    @classmethod
    def build_dir(
        cls,
        local_dir: StrPath,
        name: str | None = None,
        url: str | None = None,
        token: str | None = None,
        *,
        client: Client | None = None,
        request_timeout: float | None = None,
    ) -> LayerInfo:
        """Build a layer from a local directory and name it (name:version).

        The directory is packed as a deterministic tar (sorted, times zeroed,
        numeric owners, modes with setuid/setgid/sticky, symlinks, hard links
        and xattrs kept; the directory itself is not an entry) and streamed
        to the server while it is read: it is never held in memory. The same
        tree gives the same upload. Raises InvalidArgumentError for a path
        that is not a directory or a tree with a device node, FIFO or socket.
        """
        c = _sync(client, url, token)
        params = _ops.layer_params("tar", name)
        return c.run(_ops.upload_layer(params, _tar_body(local_dir), request_timeout or LAYER_TIMEOUT))

    @classmethod
    def upload(
        cls,
        path_or_fileobj: StrPath | IO[bytes],
        kind: str = "tar",
        name: str | None = None,
        url: str | None = None,
        token: str | None = None,
        *,
        client: Client | None = None,
        request_timeout: float | None = None,
    ) -> LayerInfo:
        """Build a layer from an archive, streamed, and name it (name:version).

        ``kind`` is "tar" (a tar, gzip allowed) or "oci" (an OCI image layout
        as a tar, or a ``docker save`` archive: its layers are flattened).
        A path is opened and closed here; a binary file object is read from
        its current position and left open.
        """
        c = _sync(client, url, token)
        params = _ops.layer_params(kind, name)
        f, opened = _open_archive(path_or_fileobj)
        try:
            body = Body(f, content_type=_ops.TAR_TYPE)
            return c.run(_ops.upload_layer(params, body, request_timeout or LAYER_TIMEOUT))
        finally:
            if opened:
                f.close()

    @classmethod
    def get(cls, ref: str, url: str | None = None, token: str | None = None, *, client: Client | None = None) -> LayerInfo:
        """The layer ref; NotFoundError if there is none."""
        c = _sync(client, url, token)
        return c.run(_ops.get_layer(ref, c.options.request_timeout))

    @classmethod
    def list(cls, url: str | None = None, token: str | None = None, *, client: Client | None = None) -> List[LayerInfo]:
        """Every layer on the server."""
        c = _sync(client, url, token)
        return c.run(_ops.list_layers(c.options.request_timeout))

    @classmethod
    def delete(cls, ref: str, url: str | None = None, token: str | None = None, *, client: Client | None = None) -> None:
        """Remove a layer name (name:version) or, given an ID, the layer and its blobs.

        Raises NotFoundError if there is no such layer, ConflictError if an
        image or a live sandbox uses it.
        """
        c = _sync(client, url, token)
        c.run(_ops.delete_layer(ref, c.options.request_timeout))


class AsyncLayer:
    """As :class:`Layer`, with coroutines; the tar of ``build_dir`` is made in a thread."""

    @classmethod
    async def build_dir(
        cls,
        local_dir: StrPath,
        name: str | None = None,
        url: str | None = None,
        token: str | None = None,
        *,
        client: AsyncClient | None = None,
        request_timeout: float | None = None,
    ) -> LayerInfo:
        c = _async(client, url, token)
        params = _ops.layer_params("tar", name)
        return await c.run(_ops.upload_layer(params, _tar_body(local_dir), request_timeout or LAYER_TIMEOUT))

    @classmethod
    async def upload(
        cls,
        path_or_fileobj: StrPath | IO[bytes],
        kind: str = "tar",
        name: str | None = None,
        url: str | None = None,
        token: str | None = None,
        *,
        client: AsyncClient | None = None,
        request_timeout: float | None = None,
    ) -> LayerInfo:
        c = _async(client, url, token)
        params = _ops.layer_params(kind, name)
        f, opened = _open_archive(path_or_fileobj)
        try:
            body = Body(f, content_type=_ops.TAR_TYPE)
            return await c.run(_ops.upload_layer(params, body, request_timeout or LAYER_TIMEOUT))
        finally:
            if opened:
                f.close()

    @classmethod
    async def get(
        cls, ref: str, url: str | None = None, token: str | None = None, *, client: AsyncClient | None = None
    ) -> LayerInfo:
        c = _async(client, url, token)
        return await c.run(_ops.get_layer(ref, c.options.request_timeout))

    @classmethod
    async def list(
        cls, url: str | None = None, token: str | None = None, *, client: AsyncClient | None = None
    ) -> List[LayerInfo]:
        c = _async(client, url, token)
        return await c.run(_ops.list_layers(c.options.request_timeout))

    @classmethod
    async def delete(
        cls, ref: str, url: str | None = None, token: str | None = None, *, client: AsyncClient | None = None
    ) -> None:
        c = _async(client, url, token)
        await c.run(_ops.delete_layer(ref, c.options.request_timeout))


class Image:
    """Images on the server (``Image.create``, ``Image.list``, …).

    Every method takes ``url=``/``token=`` or ``client=`` as
    :meth:`Sandbox.create <libdsec.Sandbox.create>` does. References are
    name[:tag] (names may contain '/') or image IDs (``sha256:…``).
    """

    @classmethod
    def create(
        cls,
        name: str,
        base: str | None = None,
        workspace: str | None = None,
        toolkit: str | None = None,
        layers: _ops.LayersSpec | None = None,
        tiers: Iterable[str] | None = None,
        url: str | None = None,
        token: str | None = None,
        *,
        client: Client | None = None,
    ) -> ImageInfo:
        """Compose an image from layers and name it ``name`` (name:tag).

        Layers are references (name:version or ID). Bottom first they are
        base, workspace, toolkit, then ``layers``: a mapping {role: ref}
        (base, workspace and toolkit first, then the rest as given) or a list
        of (role, ref). ``tiers`` lists the tiers it is meant for (default
        any). A tag that named another image moves. Raises NotFoundError for
        an unknown layer.
        """
        c = _sync(client, url, token)
        body = _ops.image_body(name, base=base, workspace=workspace, toolkit=toolkit, layers=layers, tiers=tiers)
        return c.run(_ops.create_image(body, c.options.request_timeout))

    @classmethod
    def get(cls, ref: str, url: str | None = None, token: str | None = None, *, client: Client | None = None) -> ImageInfo:
        """The image ref; NotFoundError if there is none."""
        c = _sync(client, url, token)
        return c.run(_ops.get_image(ref, c.options.request_timeout))

    @classmethod
    def list(cls, url: str | None = None, token: str | None = None, *, client: Client | None = None) -> List[ImageInfo]:
        """Every image, one entry per name (and one per unnamed image)."""
        c = _sync(client, url, token)
        return c.run(_ops.list_images(c.options.request_timeout))

    @classmethod
    def tag(
        cls, ref: str, name: str, url: str | None = None, token: str | None = None, *, client: Client | None = None
    ) -> ImageInfo:
        """Point ``name`` (name:tag) at the image ref and return the image."""
        c = _sync(client, url, token)
        return c.run(_ops.tag_image(ref, name, c.options.request_timeout))

    @classmethod
    def delete(cls, ref: str, url: str | None = None, token: str | None = None, *, client: Client | None = None) -> None:
        """Remove an image name (name:tag) or, given an ID, the image and all its names.

        Raises NotFoundError if there is no such image, ConflictError if a
        live sandbox uses it.
        """
        c = _sync(client, url, token)
        c.run(_ops.delete_image(ref, c.options.request_timeout))


class AsyncImage:
    """As :class:`Image`, with coroutines."""

    @classmethod
    async def create(
        cls,
        name: str,
        base: str | None = None,
        workspace: str | None = None,
        toolkit: str | None = None,
        layers: _ops.LayersSpec | None = None,
        tiers: Iterable[str] | None = None,
        url: str | None = None,
        token: str | None = None,
        *,
        client: AsyncClient | None = None,
    ) -> ImageInfo:
        c = _async(client, url, token)
        body = _ops.image_body(name, base=base, workspace=workspace, toolkit=toolkit, layers=layers, tiers=tiers)
        return await c.run(_ops.create_image(body, c.options.request_timeout))

    @classmethod
    async def get(
        cls, ref: str, url: str | None = None, token: str | None = None, *, client: AsyncClient | None = None
    ) -> ImageInfo:
        c = _async(client, url, token)
        return await c.run(_ops.get_image(ref, c.options.request_timeout))

    @classmethod
    async def list(
        cls, url: str | None = None, token: str | None = None, *, client: AsyncClient | None = None
    ) -> List[ImageInfo]:
        c = _async(client, url, token)
        return await c.run(_ops.list_images(c.options.request_timeout))

    @classmethod
    async def tag(
        cls, ref: str, name: str, url: str | None = None, token: str | None = None, *, client: AsyncClient | None = None
    ) -> ImageInfo:
        c = _async(client, url, token)
        return await c.run(_ops.tag_image(ref, name, c.options.request_timeout))

    @classmethod
    async def delete(
        cls, ref: str, url: str | None = None, token: str | None = None, *, client: AsyncClient | None = None
    ) -> None:
        c = _async(client, url, token)
        await c.run(_ops.delete_image(ref, c.options.request_timeout))
