"""Unit tests that need no server: the deterministic tar packer, and the
requests Layer, Image and Sandbox.create(layers=) build (on httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

import libdsec
from libdsec import (
    AsyncImage,
    AsyncLayer,
    ConflictError,
    Image,
    ImageInfo,
    InvalidArgumentError,
    Layer,
    LayerInfo,
    NotFoundError,
    RateLimitError,
)
from libdsec._tar import UnsupportedFileError, iter_tar

# ------------------------------------------------------------ tar packer

BIG = 3 * (1 << 20) + 123  # spans several chunks


def _set_xattr(path: Path, name: str, value: bytes) -> bool:
    setxattr = getattr(os, "setxattr", None)
    if setxattr is None:
        return False
    try:
        setxattr(path, name, value, follow_symlinks=False)
    except OSError:
        return False
    return True


def make_tree(root: Path, reverse: bool = False) -> bool:
    """A tree with every kind of entry; reverse creates it in another order
    (other inode numbers and directory order on disk). Returns whether the
    file system took user xattrs."""
    steps: list[Callable[[], Any]] = [
        lambda: (root / "src" / "pkg").mkdir(parents=True),
        lambda: (root / "tmp").mkdir(),
        lambda: (root / "src" / "pkg" / "main.py").write_text("print('hi')\n"),
        lambda: (root / "src" / "run.sh").write_text("#!/bin/sh\necho run\n"),
        lambda: (root / "empty").write_bytes(b""),
        lambda: (root / "big.bin").write_bytes(bytes(range(256)) * (BIG // 256) + b"x" * (BIG % 256)),
        lambda: (root / "link").symlink_to("src/run.sh"),
        lambda: (root / "src" / "dangling").symlink_to("/nowhere"),
        lambda: (root / "ünïcode-名前.txt").write_text("utf-8 name\n"),
    ]
    if reverse:
        steps = steps[:2] + steps[2:][::-1]
    for s in steps:
        s()
    links = ["src/pkg/big-link", "hard"]
    for name in reversed(links) if reverse else links:
        os.link(root / "big.bin", root / name)
    for p, m in {
        "src/run.sh": 0o4755,
        "src/pkg": 0o2755,
        "tmp": 0o1777,
        "empty": 0o600,
        "big.bin": 0o640,
        "src/pkg/main.py": 0o644,
        "src": 0o755,
        "ünïcode-名前.txt": 0o644,
    }.items():
        os.chmod(root / p, m)
    if os.geteuid() == 0:
        os.lchown(root / "src" / "pkg" / "main.py", 1234, 5678)
    if not _set_xattr(root / "src" / "pkg" / "main.py", "user.dsec.test", b"v\x00\xff"):
        return False
    assert _set_xattr(root / "src", "user.b", b"2")
    assert _set_xattr(root / "src", "user.a", b"1")
    return True


def tar_bytes(root: Path, chunk_size: int = 1 << 20) -> bytes:
    return b"".join(iter_tar(root, chunk_size))


def entries(data: bytes) -> list[dict[str, Any]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        for ti in tf:
            content = tf.extractfile(ti).read() if ti.isreg() else b""  # type: ignore[union-attr]
            assert ti.mtime == 0 and ti.uname == "" and ti.gname == ""
            assert not {"atime", "ctime", "mtime"} & set(ti.pax_headers)
            xattrs = {
                k[len("SCHILY.xattr."):]: v.encode("utf-8", "surrogateescape")
                for k, v in ti.pax_headers.items()
                if k.startswith("SCHILY.xattr.")
            }
            out.append({
                "name": ti.name, "type": ti.type, "mode": ti.mode, "uid": ti.uid, "gid": ti.gid,
                "size": ti.size, "link": ti.linkname,
                "data": content if len(content) <= 64 else hashlib.sha256(content).hexdigest(),
                "xattrs": xattrs,
            })
    return out


def test_tar_is_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert make_tree(a) == make_tree(b, reverse=True)
    ta, tb = tar_bytes(a), tar_bytes(b)
    assert hashlib.sha256(ta).hexdigest() == hashlib.sha256(tb).hexdigest()
    assert tar_bytes(a) == ta
    # The chunking does not change the bytes; new mtimes change nothing.
    assert tar_bytes(a, chunk_size=4096) == ta
    os.utime(a / "src" / "run.sh", (1_000_000_000, 1_000_000_000))
    assert tar_bytes(a) == ta
    # A symlink to the tree gives the tree's tar.
    (tmp_path / "link").symlink_to(a)
    assert tar_bytes(tmp_path / "link") == ta


def test_tar_content_round_trips(tmp_path: Path) -> None:
    has_xattrs = make_tree(tmp_path)
    uid, gid = os.geteuid(), os.getegid()
    main_owner = (1234, 5678) if uid == 0 else (uid, gid)
    big = (tmp_path / "big.bin").read_bytes()
    big_sum = hashlib.sha256(big).hexdigest()

    def e(name: str, type: bytes, mode: int, size: int = 0, link: str = "", data: Any = b"",
          owner: tuple[int, int] = (uid, gid), xattrs: dict[str, bytes] | None = None) -> dict[str, Any]:
        return {"name": name, "type": type, "mode": mode, "uid": owner[0], "gid": owner[1], "size": size,
                "link": link, "data": data, "xattrs": xattrs or {}}

    want = [
        e("big.bin", tarfile.REGTYPE, 0o640, len(big), data=big_sum),
        e("empty", tarfile.REGTYPE, 0o600),
        e("hard", tarfile.LNKTYPE, 0o640, link="big.bin"),
        e("link", tarfile.SYMTYPE, 0o777, link="src/run.sh"),
        e("src", tarfile.DIRTYPE, 0o755, xattrs={"user.a": b"1", "user.b": b"2"} if has_xattrs else None),
        e("src/dangling", tarfile.SYMTYPE, 0o777, link="/nowhere"),
        e("src/pkg", tarfile.DIRTYPE, 0o2755),
        e("src/pkg/big-link", tarfile.LNKTYPE, 0o640, link="big.bin"),
        e("src/pkg/main.py", tarfile.REGTYPE, 0o644, 12, data=b"print('hi')\n", owner=main_owner,
          xattrs={"user.dsec.test": b"v\x00\xff"} if has_xattrs else None),
        e("src/run.sh", tarfile.REGTYPE, 0o4755, 19, data=b"#!/bin/sh\necho run\n"),
        e("tmp", tarfile.DIRTYPE, 0o1777),
        e("ünïcode-名前.txt", tarfile.REGTYPE, 0o644, 11, data=b"utf-8 name\n"),
    ]
    assert entries(tar_bytes(tmp_path)) == want
    # Directories are written with a trailing slash, as tar tools expect.
    raw = tar_bytes(tmp_path)
    assert b"src/pkg/\x00" in raw and b"./" not in raw[:512]


def test_tar_streams_in_bounded_chunks(tmp_path: Path) -> None:
    make_tree(tmp_path)
    chunks = list(iter_tar(tmp_path, 64 << 10))
    assert len(chunks) > BIG // (64 << 10)
    assert max(len(c) for c in chunks) < (64 << 10) + 8192


def test_tar_refuses_special_files(tmp_path: Path) -> None:
    (tmp_path / "ok").write_text("x")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(UnsupportedFileError, match=r"pipe \(FIFO\): device nodes, FIFOs and sockets"):
        tar_bytes(tmp_path)
    assert issubclass(UnsupportedFileError, InvalidArgumentError)


def test_tar_bad_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        tar_bytes(tmp_path / "missing")
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        tar_bytes(tmp_path / "f")
    assert entries(tar_bytes(tmp_path / ".." / tmp_path.name)) != []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert tar_bytes(empty) == b"\0" * 1024


# ------------------------------------------------------------ requests


def _mock(handler: Any, **options: Any) -> libdsec.Client:
    c = libdsec.Client("http://dsec.invalid", "tok", backoff_base=0.001, **options)
    c._http.close()
    c._http = httpx.Client(transport=httpx.MockTransport(handler), **c._client_kwargs())
    return c


LAYER_JSON = {"id": "sha256:aa", "names": ["team/ws:1"], "meta_size": 4096, "blob_size": 100,
              "source_kind": "tar", "source_digest": "sha256:cc", "builder": "dsec/1",
              "created_at": "2026-01-01T00:00:00Z"}
IMAGE_JSON = {"id": "sha256:bb", "name": "team/py:1", "source": "layers", "tiers": ["function"],
              "layers": [{"role": "base", "id": "sha256:01"}, {"role": "workspace", "id": "sha256:aa"}],
              "created_at": "2026-01-01T00:00:00Z"}


def test_models() -> None:
    li = LayerInfo.from_json(LAYER_JSON)
    assert (li.id, li.names, li.meta_size, li.source_kind, li.source_digest, li.builder) == (
        "sha256:aa", ["team/ws:1"], 4096, "tar", "sha256:cc", "dsec/1")
    assert li.created_at is not None and li.name == "team/ws:1"
    assert LayerInfo.from_json({"id": "sha256:x"}).name == "sha256:x"
    ii = ImageInfo.from_json(IMAGE_JSON)
    assert ii.layers == [("base", "sha256:01"), ("workspace", "sha256:aa")]
    assert (ii.name, ii.tiers, ii.source) == ("team/py:1", ["function"], "layers")


def test_build_dir_streams_a_tar(tmp_path: Path) -> None:
    make_tree(tmp_path)
    seen: list[httpx.Request] = []
    bodies: list[bytes] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        bodies.append(req.read())
        return httpx.Response(201, json=LAYER_JSON)

    c = _mock(handler)
    info = Layer.build_dir(tmp_path, name="team/ws:1", client=c)
    assert isinstance(info, LayerInfo) and info.id == "sha256:aa"
    r = seen[0]
    assert (r.method, r.url.path) == ("POST", "/v1/layers")
    assert r.url.params.multi_items() == [("kind", "tar"), ("name", "team/ws:1")]
    assert r.headers["content-type"] == "application/x-tar"
    assert "content-length" not in r.headers and r.headers["transfer-encoding"] == "chunked"
    assert bodies[0] == tar_bytes(tmp_path)


def test_build_dir_is_not_retried_and_refuses_bad_trees(tmp_path: Path) -> None:
    n = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal n
        n += 1
        req.read()
        return httpx.Response(429, json={"code": "rate_limited", "message": "wait"}, headers={"Retry-After": "0"})

    c = _mock(handler)
    with pytest.raises(RateLimitError):
        Layer.build_dir(tmp_path, client=c)
    assert n == 1, "a streamed tar cannot be sent again"
    with pytest.raises(InvalidArgumentError, match="no such directory"):
        Layer.build_dir(tmp_path / "missing", client=c)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsupportedFileError):
        Layer.build_dir(tmp_path, client=c)
    with pytest.raises(InvalidArgumentError):
        Layer.build_dir(tmp_path, name="", client=c)
    assert n <= 2


def test_upload(tmp_path: Path) -> None:
    seen: list[tuple[str, list[tuple[str, str]], str, str | None, bytes]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        body = req.read()
        seen.append((req.url.path, req.url.params.multi_items(), req.headers["content-type"],
                     req.headers.get("content-length"), body))
        if len(seen) == 1:
            return httpx.Response(429, json={"code": "rate_limited", "message": "wait"}, headers={"Retry-After": "0"})
        return httpx.Response(201, json=LAYER_JSON)

    archive = tmp_path / "img.tar"
    archive.write_bytes(b"docker save bytes")
    c = _mock(handler)
    # A file on disk is rewound and sent again after a 429.
    assert Layer.upload(archive, kind="oci", name="py:3", client=c).id == "sha256:aa"
    with open(archive, "rb") as f:
        f.seek(7)
        Layer.upload(f, client=c)
        assert not f.closed
    want_oci = ("/v1/layers", [("kind", "oci"), ("name", "py:3")], "application/x-tar", "17", b"docker save bytes")
    assert seen == [want_oci, want_oci,
                    ("/v1/layers", [("kind", "tar")], "application/x-tar", "10", b"save bytes")]
    with pytest.raises(InvalidArgumentError, match="kind"):
        Layer.upload(archive, kind="zip", client=c)
    with pytest.raises(InvalidArgumentError, match="build_dir"):
        Layer.upload(tmp_path, client=c)


def test_refs_in_paths() -> None:
    seen: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(f"{req.method} {req.url.raw_path.decode()}")
        if req.method == "DELETE":
            if b"busy" in req.url.raw_path:
                return httpx.Response(409, json={"code": "layer_in_use", "message": "used by fn:1", "class": "conflict"})
            return httpx.Response(204)
        if b"missing" in req.url.raw_path:
            return httpx.Response(404, json={"code": "image_not_found", "message": "no image", "class": "not_found"})
        return httpx.Response(200, json=LAYER_JSON if b"layers" in req.url.raw_path else IMAGE_JSON)

    c = _mock(handler)
    assert Layer.get("toolkit/wasm-tools:0a1b", client=c).id == "sha256:aa"
    Layer.get("my layers/a b:1", client=c)
    Layer.delete("sha256:0123", client=c)
    with pytest.raises(ConflictError) as ei:
        Layer.delete("base/busy:1", client=c)
    assert ei.value.code == "layer_in_use" and ei.value.status == 409
    assert Image.get("team/py:3.12", client=c).name == "team/py:1"
    with pytest.raises(NotFoundError):
        Image.get("missing:1", client=c)
    Image.delete("q%?#x:1", client=c)
    assert seen == [
        "GET /v1/layers/toolkit/wasm-tools:0a1b",
        "GET /v1/layers/my%20layers/a%20b:1",
        "DELETE /v1/layers/sha256:0123",
        "DELETE /v1/layers/base/busy:1",
        "GET /v1/images/team/py:3.12",
        "GET /v1/images/missing:1",
        "DELETE /v1/images/q%25%3F%23x:1",
    ]
    for bad in ["", "/abs", "a//b", "a/../b", "a/"]:
        with pytest.raises(InvalidArgumentError):
            Layer.get(bad, client=c)
        with pytest.raises(InvalidArgumentError):
            Image.delete(bad, client=c)


def test_image_create_tag_list() -> None:
    bodies: list[tuple[str, str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        body = json.loads(req.read()) if req.method == "POST" else None
        bodies.append((req.method, req.url.path, body))
        if req.url.path == "/v1/images" and req.method == "GET":
            return httpx.Response(200, json={"images": [IMAGE_JSON]})
        if req.url.path == "/v1/layers":
            return httpx.Response(200, json={"layers": [LAYER_JSON]})
        return httpx.Response(201, json=IMAGE_JSON)

    c = _mock(handler)
    assert isinstance(Image.create("team/py:1", base="base/busybox:1", workspace="ws:1", toolkit="toolkit/wasm-tools:2",
                                   tiers=["function"], client=c), ImageInfo)
    Image.create("fn:1", layers={"toolkit": "t:1", "data": "d:1", "base": "b:1"}, client=c)
    Image.create("fn:2", base="b:1", layers=[("data", "sha256:dd")], client=c)
    Image.tag("team/py:1", "team/py:latest", client=c)
    assert [i.name for i in Image.list(client=c)] == ["team/py:1"]
    assert [x.id for x in Layer.list(client=c)] == ["sha256:aa"]
    assert bodies == [
        ("POST", "/v1/images", {"name": "team/py:1", "base": "base/busybox:1", "workspace": "ws:1",
                                "toolkit": "toolkit/wasm-tools:2", "tiers": ["function"]}),
        ("POST", "/v1/images", {"name": "fn:1", "layers": [
            {"role": "base", "id": "b:1"}, {"role": "toolkit", "id": "t:1"}, {"role": "data", "id": "d:1"}]}),
        ("POST", "/v1/images", {"name": "fn:2", "layers": [{"role": "base", "id": "b:1"}, {"role": "data", "id": "sha256:dd"}]}),
        ("POST", "/v1/images/tag", {"image": "team/py:1", "name": "team/py:latest"}),
        ("GET", "/v1/images", None),
        ("GET", "/v1/layers", None),
    ]
    for kwargs in [{}, {"base": ""}, {"layers": []}, {"layers": [("base",)]}, {"layers": "base=x"},
                   {"layers": [("", "x")]}, {"base": "b", "tiers": [""]}]:
        with pytest.raises(InvalidArgumentError):
            Image.create("x:1", client=c, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        Image.create("", base="b", client=c)
    with pytest.raises(InvalidArgumentError):
        Image.tag("", "x:1", client=c)
    assert len(bodies) == 6


def test_sandbox_create_inline_layers() -> None:
    bodies: list[Any] = []

    def handler(req: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(req.read()))
        return httpx.Response(201, json={"id": "sb-1", "tier": "function", "image": "", "state": "running",
                                         "created_at": "2026-01-01T00:00:00Z", "expires_at": "2026-01-01T00:05:00Z"})

    c = _mock(handler)
    libdsec.Sandbox.create(layers={"workspace": "ws:1", "base": "base/busybox:1", "toolkit": "toolkit/wasm-tools:2"},
                           client=c)
    libdsec.Sandbox.create(layers=[("base", "sha256:01"), ("extra", "x:1")], client=c)
    assert [b["layers"] for b in bodies] == [
        [{"role": "base", "id": "base/busybox:1"}, {"role": "workspace", "id": "ws:1"},
         {"role": "toolkit", "id": "toolkit/wasm-tools:2"}],
        [{"role": "base", "id": "sha256:01"}, {"role": "extra", "id": "x:1"}],
    ]
    assert "image" not in bodies[0]
    with pytest.raises(InvalidArgumentError, match="image or layers"):
        libdsec.Sandbox.create(image="x", layers={"base": "b"}, client=c)
    assert len(bodies) == 2


def test_async_layer_and_image(tmp_path: Path) -> None:
    make_tree(tmp_path)
    want_tar = tar_bytes(tmp_path)
    bodies: list[bytes] = []

    async def handler(req: httpx.Request) -> httpx.Response:
        bodies.append(await req.aread())
        if req.url.path == "/v1/layers":
            return httpx.Response(201, json=LAYER_JSON)
        return httpx.Response(201, json=IMAGE_JSON)

    async def main() -> None:
        c = libdsec.AsyncClient("http://dsec.invalid", "tok")
        await c._http.aclose()
        transport = httpx.MockTransport(handler)  # type: ignore[arg-type]
        c._http = httpx.AsyncClient(transport=transport, **c._client_kwargs())
        async with c:
            info = await AsyncLayer.build_dir(tmp_path, name="ws:1", client=c)
            assert info.id == "sha256:aa"
            img = await AsyncImage.create("py:1", base="b:1", workspace=info.name, client=c)
            assert img.id == "sha256:bb"
            os.mkfifo(tmp_path / "fifo")
            with pytest.raises(UnsupportedFileError):
                await AsyncLayer.build_dir(tmp_path, client=c)

    asyncio.run(main())
    assert bodies[0] == want_tar
    assert json.loads(bodies[1]) == {"name": "py:1", "base": "b:1", "workspace": "team/ws:1"}

