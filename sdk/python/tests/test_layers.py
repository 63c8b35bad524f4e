"""Layers and images against a real `dsec up`: build a workspace layer from a
local directory, compose an image with the built-in layers, and read the
layer's files from a function sandbox (whose view is the union of the
image's layers at /)."""

from __future__ import annotations

import asyncio
import io
import tarfile
from pathlib import Path
from typing import Iterator

import pytest
from conftest import Conn

from libdsec import (
    AsyncImage,
    AsyncLayer,
    AsyncSandbox,
    ConflictError,
    Image,
    ImageInfo,
    InvalidArgumentError,
    Layer,
    LayerInfo,
    NotFoundError,
    Sandbox,
)


def _builtin(conn: Conn, prefix: str) -> str | None:
    """The name:version of a built-in layer, e.g. prefix "toolkit/wasm-tools:"."""
    for layer in Layer.list(**conn):
        for name in layer.names:
            if name.startswith(prefix):
                return name
    return None


@pytest.fixture
def workspace(conn: Conn, labels: dict[str, str], tmp_path: Path) -> Iterator[tuple[LayerInfo, str]]:
    """A workspace layer built from a local directory, and the text of its
    /data/greeting.txt; removed after the test (with what uses it)."""
    uid = labels["uid"]
    root = tmp_path / "ws"
    (root / "data" / "sub").mkdir(parents=True)
    text = f"hello from layer {uid}\n"
    (root / "data" / "greeting.txt").write_text(text)
    (root / "data" / "sub" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "data" / "sub" / "run.sh").chmod(0o755)
    (root / "data" / "link").symlink_to("greeting.txt")
    layer = Layer.build_dir(root, name=f"libdsec-test/ws-{uid}:1", **conn)
    try:
        yield layer, text
    finally:
        try:
            Layer.delete(layer.id, **conn)
        except (NotFoundError, ConflictError):
            pass


def test_build_dir_layer(conn: Conn, workspace: tuple[LayerInfo, str], labels: dict[str, str]) -> None:
    layer, _ = workspace
    assert isinstance(layer, LayerInfo)
    assert layer.id.startswith("sha256:")
    assert f"libdsec-test/ws-{labels['uid']}:1" in layer.names
    assert layer.source_kind == "tar" and layer.meta_size > 0
    assert Layer.get(layer.id, **conn).id == layer.id
    assert Layer.get(layer.names[0], **conn).id == layer.id
    assert layer.id in {x.id for x in Layer.list(**conn)}
    with pytest.raises(NotFoundError):
        Layer.get(f"libdsec-test/none-{labels['uid']}:1", **conn)


def test_same_tree_same_layer(conn: Conn, workspace: tuple[LayerInfo, str], tmp_path: Path,
                              labels: dict[str, str]) -> None:
    layer, text = workspace
    # Another copy of the same tree, made in another order.
    root = tmp_path / "copy"
    (root / "data" / "sub").mkdir(parents=True)
    (root / "data" / "link").symlink_to("greeting.txt")
    (root / "data" / "sub" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "data" / "sub" / "run.sh").chmod(0o755)
    (root / "data" / "greeting.txt").write_text(text)
    again = Layer.build_dir(root, **conn)
    assert again.id == layer.id


def test_upload_tar(conn: Conn, labels: dict[str, str], tmp_path: Path) -> None:
    archive = tmp_path / "layer.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        data = b"from a tar\n"
        ti = tarfile.TarInfo("etc/from-tar.txt")
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    layer = Layer.upload(archive, kind="tar", name=f"libdsec-test/tar-{labels['uid']}:1", **conn)
    try:
        assert layer.source_kind == "tar"
        assert Layer.get(layer.names[0], **conn).id == layer.id
    finally:
        Layer.delete(layer.id, **conn)
    with pytest.raises(NotFoundError):
        Layer.get(layer.id, **conn)


def test_image_from_layers_runs_function_sandbox(
    conn: Conn, workspace: tuple[LayerInfo, str], labels: dict[str, str]
) -> None:
    layer, text = workspace
    toolkit = _builtin(conn, "toolkit/wasm-tools:")
    assert toolkit, "the server has no toolkit/wasm-tools layer"
    base = _builtin(conn, "base/busybox:")
    name = f"libdsec-test/img-{labels['uid']}:1"
    img = Image.create(name, base=base, workspace=layer.name, toolkit=toolkit, tiers=["function"], **conn)
    try:
        assert isinstance(img, ImageInfo) and img.id.startswith("sha256:")
        assert [role for role, _ in img.layers] == (["base"] if base else []) + ["workspace", "toolkit"]
        assert Image.get(name, **conn).id == img.id
        assert name in {i.name for i in Image.list(**conn)}

        with Sandbox.create(tier="function", image=name, metadata=labels, **conn) as sb:
            assert sb.commands.run(["cat", "/data/greeting.txt"]).stdout == text
            assert sb.commands.run(["cat", "/data/link"]).stdout == text

        # The same layers inline.
        inline = {"workspace": layer.id, "toolkit": toolkit}
        with Sandbox.create(tier="function", layers=inline, metadata=labels, **conn) as sb:
            assert sb.commands.run(["cat", "/data/greeting.txt"]).stdout == text

        # A tag moves, the ID stays; a layer an image uses cannot go.
        tagged = Image.tag(img.id, f"libdsec-test/img-{labels['uid']}:latest", **conn)
        assert tagged.id == img.id
        with pytest.raises(ConflictError):
            Layer.delete(layer.id, **conn)
        Image.delete(tagged.name, **conn)
        with pytest.raises(NotFoundError):
            Image.get(tagged.name, **conn)
        assert Image.get(name, **conn).id == img.id
    finally:
        Image.delete(img.id, **conn)
    with pytest.raises(NotFoundError):
        Image.get(name, **conn)


def test_async_layers_and_images(conn: Conn, labels: dict[str, str], tmp_path: Path) -> None:
    uid = labels["uid"]
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text(f"async {uid}\n")

    async def main() -> None:
        toolkit = next(n for x in await AsyncLayer.list(**conn) for n in x.names if n.startswith("toolkit/wasm-tools:"))
        layer = await AsyncLayer.build_dir(tmp_path / "ws", name=f"libdsec-test/aws-{uid}:1", **conn)
        name = f"libdsec-test/aimg-{uid}:1"
        img = await AsyncImage.create(name, layers=[("workspace", layer.id), ("toolkit", toolkit)], **conn)
        try:
            assert (await AsyncImage.get(name, **conn)).id == img.id
            sb = await AsyncSandbox.create(tier="function", image=name, metadata=labels, **conn)
            async with sb:
                assert (await sb.commands.run(["cat", "/a.txt"])).stdout == f"async {uid}\n"
        finally:
            await AsyncImage.delete(img.id, **conn)
            await AsyncLayer.delete(layer.id, **conn)

    asyncio.run(main())


def test_image_for_container_gets_the_agent(conn: Conn, labels: dict[str, str]) -> None:
    """An image composed from a bare base runs on the container tier (the
    server adds its agent layer), and a base may name an image."""
    base = _builtin(conn, "base/busybox:")
    assert base, "the server has no base/busybox layer"
    uid = labels["uid"]
    bare, on_image = f"libdsec-test/bare-{uid}:1", f"libdsec-test/onimg-{uid}:1"
    img = Image.create(bare, base=base, **conn)
    try:
        assert [role for role, _ in img.layers] == ["base", "toolkit"], img.layers
        with Sandbox.create(tier="container", image=bare, metadata=labels, **conn) as sb:
            assert sb.commands.run("echo ran").stdout == "ran\n"
        # The built-in busybox image as the base: its layers, nothing added.
        child = Image.create(on_image, base="busybox", tiers=["container"], **conn)
        try:
            assert child.layers == Image.get("busybox", **conn).layers
        finally:
            Image.delete(child.id, **conn)
        with pytest.raises(InvalidArgumentError) as e:
            Image.create(f"libdsec-test/bad-{uid}:1", base=base, workspace="busybox", **conn)
        assert e.value.code == "image_not_layer" and "only be the base" in str(e.value)
    finally:
        Image.delete(img.id, **conn)
