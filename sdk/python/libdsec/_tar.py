"""A deterministic tar of a local directory, produced as a stream of chunks.

The same tree always gives the same bytes, wherever it lives (the Go
client's tardir package follows the same rules):

* entries in lexical order of their paths (compared as bytes), each path
  relative to the directory, '/'-separated, without "./"; directories end
  in "/"; the directory itself is not an entry, so a layer's root takes the
  server's defaults rather than, say, the 0700 of a temporary directory;
* regular files, directories and symlinks; the second and later paths of a
  file with several are hard links to the first;
* permission bits with setuid, setgid and sticky; numeric uid and gid with
  no user or group names; modification time 0; no access or change times;
* extended attributes as PAX records ``SCHILY.xattr.<name>``, on Linux
  (the only platform whose os module reads them);
* device nodes, FIFOs and sockets are refused.

File contents are read in chunks as the stream is consumed: the archive is
never held in memory whole.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tarfile
from typing import Iterator

from .errors import InvalidArgumentError

__all__ = ["iter_tar", "UnsupportedFileError"]

BLOCK = tarfile.BLOCKSIZE  # 512
# Yield once this much is buffered; files are read in chunks of this size.
CHUNK = 1 << 20
XATTR_PREFIX = "SCHILY.xattr."


class UnsupportedFileError(InvalidArgumentError):
    """The directory holds a device node, FIFO or socket, which layers do not carry."""


def _xattrs(path: str) -> dict[str, bytes]:
    """The extended attributes of path (not following a final symlink)."""
    if sys.platform != "linux":
        return {}
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return {}
        raise
    out: dict[str, bytes] = {}
    for name in sorted(names, key=os.fsencode):
        try:
            out[name] = os.getxattr(path, name, follow_symlinks=False)
        except OSError as e:
            if e.errno == errno.ENODATA:
                continue  # removed since the list was read
            raise
    return out


def _kind(mode: int) -> str:
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def _walk(root: str, rel: str) -> Iterator[tuple[str, str]]:
    """(full path, relative path) of everything under root/rel, depth first, sorted."""
    base = os.path.join(root, rel) if rel else root
    with os.scandir(base) as it:
        names = sorted((e.name for e in it), key=os.fsencode)
    for name in names:
        r = f"{rel}/{name}" if rel else name
        full = os.path.join(root, r)
        yield full, r
        if stat.S_ISDIR(os.lstat(full).st_mode):
            yield from _walk(root, r)


def _header(full: str, rel: str, st: os.stat_result, links: dict[tuple[int, int], str]) -> tarfile.TarInfo:
    mode = st.st_mode
    ti = tarfile.TarInfo(rel)
    ti.mode = stat.S_IMODE(mode)
    ti.uid, ti.gid = st.st_uid, st.st_gid
    ti.uname = ti.gname = ""
    ti.mtime = 0
    if stat.S_ISDIR(mode):
        ti.type = tarfile.DIRTYPE
    elif stat.S_ISREG(mode):
        ti.type, ti.size = tarfile.REGTYPE, st.st_size
    elif stat.S_ISLNK(mode):
        ti.type, ti.linkname = tarfile.SYMTYPE, os.readlink(full)
    else:
        raise UnsupportedFileError(
            f"{full} ({_kind(mode)}): device nodes, FIFOs and sockets cannot go into a layer",
            code="unsupported_file",
        )
    if not stat.S_ISDIR(mode) and st.st_nlink > 1:
        key = (st.st_dev, st.st_ino)
        first = links.get(key)
        if first is None:
            links[key] = rel
        else:
            ti.type, ti.linkname, ti.size = tarfile.LNKTYPE, first, 0
    # Bytes that are not UTF-8 survive as surrogates; tarfile then writes
    # the records with hdrcharset=BINARY.
    xattrs = {XATTR_PREFIX + n: v.decode("utf-8", "surrogateescape") for n, v in _xattrs(full).items()}
    if xattrs:
        ti.pax_headers = xattrs
    return ti


def iter_tar(directory: str | os.PathLike[str], chunk_size: int = CHUNK) -> Iterator[bytes]:
    """Yield the deterministic tar of directory in chunks of about chunk_size bytes.

    Raises FileNotFoundError / NotADirectoryError for a bad directory (at the
    first next()), UnsupportedFileError for a device node, FIFO or socket, and
    OSError for a file that cannot be read or changed size while being read.
    """
    root = os.path.realpath(os.fspath(directory))
    if not os.path.isdir(root):
        if not os.path.exists(root):
            raise FileNotFoundError(errno.ENOENT, "no such directory", os.fspath(directory))
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", os.fspath(directory))
    links: dict[tuple[int, int], str] = {}
    buf = bytearray()
    for full, rel in _walk(root, ""):
        st = os.lstat(full)
        ti = _header(full, rel, st, links)
        buf += ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        if ti.type == tarfile.REGTYPE and ti.size:
            left = ti.size
            with open(full, "rb") as f:
                while left:
                    if len(buf) >= chunk_size:
                        yield bytes(buf)
                        buf.clear()
                    data = f.read(min(chunk_size, left))
                    if not data:
                        raise OSError(f"{full} shrank from {ti.size} to {ti.size - left} bytes while being read")
                    buf += data
                    left -= len(data)
            pad = -ti.size % BLOCK
            buf += b"\0" * pad
        if len(buf) >= chunk_size:
            yield bytes(buf)
            buf.clear()
    buf += b"\0" * (2 * BLOCK)  # the end-of-archive marker
    yield bytes(buf)
