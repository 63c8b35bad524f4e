package layer

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// dirSink fills a tree from the walk of a directory on the host (a state
// layer's source, a sandbox's captured writable state): directories,
// regular files (their data copied into the blob as they are hashed),
// symlinks and overlay whiteouts, with owners, modes, xattrs (overlay's
// opaque markers included), modification times and hard links as they
// are on disk.
type dirSink struct {
	t     *tree
	nodes map[string]*node // by path relative to the root, "." the root
	off   int64            // the blob offset of the file content copied last
}

func newDirSink(t *tree) *dirSink {
	return &dirSink{t: t, nodes: map[string]*node{".": t.root}}
}

func (s *dirSink) content(ctx context.Context, p string, size int64) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, fmt.Errorf("reading layer source: %w", err)
	}
	defer f.Close()
	off, sum, err := s.t.blob.addSum(ctx, f, size)
	if err != nil {
		return "", 0, err
	}
	s.off = off
	return hex.EncodeToString(sum[:]), size, nil
}

func (s *dirSink) add(e treeEntry) error {
	st := e.st
	ino := &inode{
		mode: st.Mode & 0o7777, uid: st.Uid, gid: st.Gid,
		mtime: uint64(st.Mtim.Sec), mtimeNs: uint32(st.Mtim.Nsec),
	}
	for _, x := range e.xattrs {
		if ino.xattrs == nil {
			ino.xattrs = map[string]string{}
		}
		ino.xattrs[x.Name] = string(x.Value)
	}
	switch e.typ {
	case "d":
		ino.kind = kindDir
	case "f":
		ino.kind, ino.size, ino.off = kindFile, st.Size, s.off
		if e.link != "" {
			first := s.nodes[e.link]
			if first == nil {
				return fmt.Errorf("building layer: hard link %s to %s, which is not in the tree", e.rel, e.link)
			}
			ino = first.ino // the tree shares the inode
		}
	case "l":
		ino.kind, ino.mode, ino.target = kindSymlink, 0o777, e.target
	case "w":
		ino.kind = kindWhiteout
	default:
		return errdefs.New(errdefs.Invalid, api.CodeSpecialFile, "%s cannot be in a layer", e.rel)
	}
	if e.rel == "." {
		if ino.kind != kindDir {
			return errdefs.New(errdefs.Invalid, api.CodeLayerSourceNotDirectory, "the layer source is not a directory")
		}
		s.t.root.ino = ino
		return nil
	}
	dir, name := path.Split(e.rel)
	parent := s.nodes[path.Clean(dir)]
	if dir == "" {
		parent = s.t.root
	}
	if parent == nil || parent.children == nil {
		return fmt.Errorf("building layer: %s has no parent directory in the tree", e.rel)
	}
	n := &node{name: name, parent: parent, ino: ino}
	if ino.kind == kindDir {
		n.children = map[string]*node{}
	}
	parent.children[name] = n
	if ino.kind == kindDir || ino.kind == kindFile {
		s.nodes[e.rel] = n
	}
	return nil
}

func buildState(ctx context.Context, root, outDir string) (Artifact, error) {
	// One walk hashes the tree and copies it into the layer.
	var digest string
	err := buildTree(ctx, outDir, true, func(t *tree) error {
		var err error
		digest, err = walkTree(ctx, root, true, newDirSink(t))
		return err
	})
	if err != nil {
		return Artifact{}, err
	}
	return finish(ctx, outDir, Source{Kind: SourceState, Digest: digest}, goErofsBuilder("preserve-mtime", "whiteouts"), true)
}
