package sandbox

import (
	"context"
	"io"
	"time"
)

// Snapshotter is implemented by sandboxes whose tier can copy out their
// writable state, for a snapshot (a state layer: see
// docs/design/trajectories.md). The node builds the layer from what
// CaptureState copies.
type Snapshotter interface {
	// CaptureState holds the sandbox still (its processes frozen, or its
	// calls held off) while it copies into dst, an empty directory on the
	// node, the entries of its writable state that differ from since
	// (every entry when since is nil), laid out as the layer's tree, with
	// whiteouts for entries removed since. It returns the index of the
	// state as copied, for the next snapshot.
	CaptureState(ctx context.Context, dst string, since *StateIndex) (*StateIndex, CaptureStats, error)
}

// StateIndex is what a snapshot stored: each entry's identity and
// metadata, by path, to find what changed since. It lives in the node's
// memory only.
type StateIndex struct {
	entries map[string]stateKey
}

// Len is the number of entries indexed.
func (x *StateIndex) Len() int { return len(x.entries) }

// stateKey identifies an entry's version: any change to it (content
// included: it moves mtime and ctime) changes the key.
type stateKey struct {
	mode         uint32
	uid, gid     uint32
	size         int64
	mtime, ctime int64
	ino, rdev    uint64
	opaque       bool
}

// CaptureStats says what CaptureState copied.
type CaptureStats struct {
	Entries   int   // entries of the state
	Copied    int   // entries copied (files, dirs, symlinks, whiteouts)
	Whiteouts int   // of which whiteouts
	Bytes     int64 // file content copied
	// Frozen is how long the sandbox was held still.
	Frozen time.Duration
}

// CaptureOptions tell CaptureState where the state is and how it maps
// into the layer.
type CaptureOptions struct {
	// Src is the state's top directory: a path the node reaches, which
	// nothing may change during the capture (the sandbox is held still).
	Src string
	// Dst is the empty directory the layer's tree is made in.
	Dst string
	// Prefix is where the state goes in the layer ("" for a root file
	// system's upper; "workspace" for the function tier's).
	Prefix string
	// Since is the previous snapshot's index (nil: a full one).
	Since *StateIndex
	// Overlay: Src is an overlay upper, whose whiteouts and opaque
	// directories are kept as such.
	Overlay bool
	// IDBase and IDCount shift owners down into the layer's ids (a
	// container's upper holds host ids, layers hold the sandbox's); an
	// owner outside the range is refused. IDCount 0: no shift.
	IDBase, IDCount uint32

	// Listing, with Read, captures a state the node cannot reach as a
	// directory, instead of Src: a microVM guest's upper, which its
	// agent lists and streams (the node never mounts a file system the
	// guest made). Both come from the guest and are hostile: the capture
	// refuses a listing whose paths are not clean, relative, unique and
	// below a listed directory, whose entries are not directories,
	// regular files, symlinks or whiteouts, or that holds more than
	// MaxBytes of file content, and a read that returns more or fewer
	// bytes than its entry's size. Only the entries copied (those changed
	// since Since) are read.
	Listing []StateEntry
	// Read streams the content of the regular file at a path of Listing.
	Read func(ctx context.Context, path string) (io.ReadCloser, error)
	// MaxBytes bounds the listed size of the state's regular files,
	// together (0: no bound).
	MaxBytes int64
	// MaxID bounds the owners of a listing (0: any id but the overflow
	// id's above).
	MaxID uint32
}

// StateEntry is one entry of a writable state as a microVM guest's agent
// lists it (agentproto.OpStateList): the lstat of a path of its upper
// directory. The top directory is ".".
type StateEntry struct {
	// Path is relative to the top, slash-separated and clean.
	Path string `json:"path"`
	// Mode is st_mode: type and permission bits.
	Mode   uint32 `json:"mode"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	Size   int64  `json:"size"`
	Mtime  int64  `json:"mtime_ns"`
	Ctime  int64  `json:"ctime_ns"`
	Ino    uint64 `json:"ino"`
	Nlink  uint64 `json:"nlink,omitempty"`
	Rdev   uint64 `json:"rdev,omitempty"`
	Target string `json:"target,omitempty"` // a symlink's
	Opaque bool   `json:"opaque,omitempty"` // a directory's trusted.overlay.opaque
}

// CaptureState copies the state at o.Src into o.Dst (see Snapshotter);
// the caller holds the sandbox still.
func CaptureState(ctx context.Context, o CaptureOptions) (*StateIndex, CaptureStats, error) {
	return captureState(ctx, o)
}
