"""sandbox.files against a real `dsec up` (function tier: confined to /workspace)."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Callable

import pytest

from libdsec import ConflictError, EntryInfo, InvalidArgumentError, NotFoundError, Sandbox

BIG = 24 << 20  # 24 MiB


def test_write_read_text_and_bytes(sandbox: Sandbox) -> None:
    info = sandbox.files.write("hello.txt", "hello, wörld\n")
    assert isinstance(info, EntryInfo)
    assert (info.name, info.path, info.type, info.size) == ("hello.txt", "/workspace/hello.txt", "file", 14)
    assert info.mtime is not None
    assert sandbox.files.read("hello.txt") == "hello, wörld\n"
    assert sandbox.files.read("/workspace/hello.txt", format="bytes") == "hello, wörld\n".encode()

    blob = bytes(range(256)) * 4
    sandbox.files.write("/workspace/bin/blob.bin", blob, mode=0o640)
    assert sandbox.files.read("bin/blob.bin", format="bytes") == blob
    assert sandbox.files.get_info("bin/blob.bin").mode & 0o777 == 0o640
    # Overwrite replaces the content entirely.
    sandbox.files.write("hello.txt", b"x")
    assert sandbox.files.read("hello.txt") == "x"
    # A file-like object is streamed.
    sandbox.files.write("from-io.txt", io.BytesIO(b"from a file object"))
    assert sandbox.files.read("from-io.txt") == "from a file object"


def test_write_without_parents(sandbox: Sandbox) -> None:
    with pytest.raises(NotFoundError):
        sandbox.files.write("no/such/dir/f.txt", "x", parents=False)
    sandbox.files.write("no/such/dir/f.txt", "x")  # parents=True by default
    assert sandbox.files.exists("no/such/dir")


def test_files_seen_by_commands(sandbox: Sandbox) -> None:
    sandbox.files.write("from-api.txt", "written by the API\n")
    assert sandbox.commands.run(["cat", "/workspace/from-api.txt"]).stdout == "written by the API\n"
    sandbox.commands.run(["write", "/workspace/from-cmd.txt"], stdin="written by a command\n")
    assert sandbox.files.read("from-cmd.txt") == "written by a command\n"


def test_list_depth(sandbox: Sandbox) -> None:
    for p in ("tree/a.txt", "tree/d1/b.txt", "tree/d1/d2/c.txt"):
        sandbox.files.write(p, p)

    def names(depth: int) -> list[str]:
        return sorted(e.path.removeprefix("/workspace/tree/") for e in sandbox.files.list("tree", depth=depth))

    assert names(1) == ["a.txt", "d1"]
    assert names(3) == ["a.txt", "d1", "d1/b.txt", "d1/d2", "d1/d2/c.txt"]
    kinds = {e.name: e.type for e in sandbox.files.list("/workspace/tree")}
    assert kinds == {"a.txt": "file", "d1": "dir"}
    assert any(e.is_dir for e in sandbox.files.list("tree"))


def test_exists_get_info(sandbox: Sandbox) -> None:
    assert not sandbox.files.exists("nothing-here")
    sandbox.files.write("here.txt", "12345")
    assert sandbox.files.exists("here.txt") and sandbox.files.exists("/workspace/here.txt")
    info = sandbox.files.get_info("here.txt")
    assert info.size == 5 and info.is_file
    assert sandbox.files.get_info("/workspace").is_dir
    with pytest.raises(NotFoundError):
        sandbox.files.get_info("nothing-here")
    with pytest.raises(NotFoundError):
        sandbox.files.read("nothing-here")


def test_make_dir_rename_remove(sandbox: Sandbox) -> None:
    assert sandbox.files.make_dir("a/b/c") is True
    assert sandbox.files.make_dir("a/b/c") is False  # already there
    assert sandbox.files.make_dir("a") is False
    assert sandbox.files.get_info("a/b/c").is_dir
    with pytest.raises(NotFoundError):
        sandbox.files.make_dir("x/y", parents=False)

    sandbox.files.write("a/f.txt", "content")
    moved = sandbox.files.rename("a/f.txt", "a/b/moved.txt")
    assert moved.path == "/workspace/a/b/moved.txt" and moved.name == "moved.txt"
    assert not sandbox.files.exists("a/f.txt")
    assert sandbox.files.read("a/b/moved.txt") == "content"

    sandbox.files.remove("a/b/moved.txt")
    assert not sandbox.files.exists("a/b/moved.txt")
    with pytest.raises(ConflictError):
        sandbox.files.remove("a")  # not empty
    sandbox.files.remove("a", recursive=True)
    assert not sandbox.files.exists("a/b/c") and not sandbox.files.exists("a")
    with pytest.raises(NotFoundError):
        sandbox.files.remove("a")


@pytest.mark.parametrize("bad", ["../../../../etc/passwd", "/workspace/../../etc/passwd", "a/../../x", "/etc/passwd", "/tmp/x"])
def test_path_traversal(sandbox: Sandbox, bad: str) -> None:
    with pytest.raises(InvalidArgumentError) as ei:
        sandbox.files.write(bad, "x")
    assert ei.value.code == "path_outside_root" and ei.value.status == 400
    ops: list[Callable[[str], object]] = [sandbox.files.read, sandbox.files.get_info, sandbox.files.exists, sandbox.files.remove]
    for op in ops:
        with pytest.raises(InvalidArgumentError):
            op(bad)
    with pytest.raises(InvalidArgumentError):
        sandbox.files.rename("nope", bad)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def test_large_upload_download(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    block = os.urandom(1 << 20)
    with open(src, "wb") as f:
        for i in range(BIG >> 20):
            f.write(bytes([i]) + block[1:])
    want = _sha256_file(src)

    info = sandbox.files.upload(src, "big/big.bin")
    assert info.size == BIG and sandbox.files.get_info("big/big.bin").size == BIG

    dst = tmp_path / "back.bin"
    assert sandbox.files.download("big/big.bin", dst) == BIG
    assert _sha256_file(dst) == want

    h = hashlib.sha256()
    n = 0
    for chunk in sandbox.files.read("big/big.bin", format="stream"):
        h.update(chunk)
        n += len(chunk)
    assert n == BIG and h.hexdigest() == want
    # A stream closed early gives its connection back.
    for _ in range(3):
        with sandbox.files.read("big/big.bin", format="stream") as stream:
            assert len(next(stream)) > 0

    # A large upload the server refuses still raises the server's reason.
    with pytest.raises(InvalidArgumentError) as ei:
        sandbox.files.upload(src, "/etc/big.bin")
    assert ei.value.code == "path_outside_root"

    # A failed download leaves no partial file behind.
    missing = tmp_path / "missing.bin"
    with pytest.raises(NotFoundError):
        sandbox.files.download("big/absent.bin", missing)
    assert not missing.exists()

    # An upload to a sandbox that has ended raises NotFoundError.
    sandbox.kill()
    with pytest.raises(NotFoundError):
        sandbox.files.upload(src, "big/again.bin")
