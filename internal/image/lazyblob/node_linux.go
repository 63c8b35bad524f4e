package lazyblob

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// rootNode is the mount's directory: go-fuse lists and looks up the
// children Server.Add gives it.
type rootNode struct {
	fs.Inode
}

var _ fs.NodeGetattrer = (*rootNode)(nil)

func (r *rootNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o555
	out.Nlink = 2
	return 0
}

// fileNode is a blob's file. Its reads go through the blob.
type fileNode struct {
	fs.Inode
	s *Server
	e *entry
}

var (
	_ fs.NodeGetattrer = (*fileNode)(nil)
	_ fs.NodeOpener    = (*fileNode)(nil)
	_ fs.NodeReader    = (*fileNode)(nil)
	_ fs.NodeReleaser  = (*fileNode)(nil)
)

func (n *fileNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	size := n.e.b.idx.Size
	out.Mode = syscall.S_IFREG | 0o444
	out.Nlink = 1
	out.Size = uint64(size)
	out.Blocks = uint64(size+511) / 512
	out.Blksize = 4096
	return 0
}

func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EROFS
	}
	if !n.s.opened(n.e) {
		return nil, 0, syscall.ENOENT
	}
	// Direct I/O: the kernel keeps no pages of the file, whose bytes
	// are in the page cache already twice, as the cache file's and as
	// the EROFS files' (warm reads measured as fast either way).
	return &openFile{e: n.e}, fuse.FOPEN_DIRECT_IO, 0
}

// openFile is an open file of a blob. It holds nothing (reads go to the
// node), but go-fuse tells a node of a file's release only if its open
// returned a handle, and the Server counts open files.
type openFile struct{ e *entry }

func (n *fileNode) Release(ctx context.Context, f fs.FileHandle) syscall.Errno {
	n.s.released(n.e)
	return 0
}

// Read serves a READ from the cache file (or, for a chunk that could not
// be cached, from memory); EIO when a chunk cannot be had (its fetch
// failed, timed out or did not match its digest).
//
// A READ the kernel interrupts (a signal to the process whose page fault
// or read EROFS is serving; Go's runtime sends its threads SIGURG all the
// time) is served on regardless, within the fetch's own deadline: EROFS
// turns any error of its device, EINTR too, into EIO for the page, so
// answering the interrupt would fail a read that was only slow.
func (n *fileNode) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	b := n.e.b
	if off < 0 || off >= b.idx.Size || len(dest) == 0 {
		return fuse.ReadResultData(nil), 0
	}
	cnt := min(int64(len(dest)), b.idx.Size-off)
	data, err := b.read(context.WithoutCancel(ctx), dest, off, cnt)
	if err != nil {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(data), 0
}
