package sandbox

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// listedState is a guest's writable state as a listing and contents.
type listedState struct {
	entries []StateEntry
	content map[string]string
	reads   []string // paths read, in order
}

func (s *listedState) read(_ context.Context, p string) (io.ReadCloser, error) {
	s.reads = append(s.reads, p)
	c, ok := s.content[p]
	if !ok {
		return nil, errors.New("no such file")
	}
	return io.NopCloser(strings.NewReader(c)), nil
}

func (s *listedState) capture(t *testing.T, since *StateIndex, maxBytes int64) (string, *StateIndex, CaptureStats, error) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "tree")
	s.reads = nil
	idx, st, err := CaptureState(context.Background(), CaptureOptions{
		Dst: dst, Since: since, Overlay: true, Listing: s.entries, Read: s.read, MaxBytes: maxBytes,
	})
	return dst, idx, st, err
}

const (
	modeDir  = syscall.S_IFDIR | 0o755
	modeFile = syscall.S_IFREG | 0o644
	modeLink = syscall.S_IFLNK | 0o777
	modeWh   = syscall.S_IFCHR
)

func dirEntry(p string, ino uint64) StateEntry {
	return StateEntry{Path: p, Mode: modeDir, Ino: ino, Mtime: 1e9}
}
func fileEntry(p string, ino uint64, size int64, mtime int64) StateEntry {
	return StateEntry{Path: p, Mode: modeFile, Ino: ino, Size: size, Mtime: mtime, Ctime: mtime, Nlink: 1, UID: 1000, GID: 1000}
}

// TestCaptureListing: a listed state becomes the same layer tree a local
// capture makes (files with their content and owners, a symlink, a
// whiteout, an opaque directory), whatever order the guest listed it in;
// the next capture reads only what changed and whites out what went.
func TestCaptureListing(t *testing.T) {
	s := &listedState{
		entries: []StateEntry{
			// Children before their parents and out of order: the capture
			// orders them itself.
			fileEntry("a/f", 3, 5, 2e9),
			dirEntry(".", 1),
			{Path: "l", Mode: modeLink, Ino: 4, Target: "a/f", Mtime: 1e9},
			dirEntry("a", 2),
			{Path: "w", Mode: modeWh, Ino: 5},
			{Path: "o", Mode: modeDir, Ino: 6, Opaque: true, Mtime: 1e9},
			fileEntry("o/g", 7, 3, 2e9),
			fileEntry("keep", 8, 4, 2e9),
			{Path: "fifo", Mode: syscall.S_IFIFO | 0o644, Ino: 9},
		},
		content: map[string]string{"a/f": "hello", "o/g": "abc", "keep": "same"},
	}
	dst, idx, st, err := s.capture(t, nil, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries != 7 || st.Bytes != 12 || st.Whiteouts != 1 {
		t.Errorf("full capture stats %+v, want 7 entries (the FIFO skipped), 12 bytes, 1 whiteout", st)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a/f")); err != nil || string(b) != "hello" {
		t.Errorf("a/f: %q, %v", b, err)
	}
	var fst syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(dst, "a/f"), &fst); err != nil || fst.Uid != 1000 || fst.Mtim.Sec != 2 {
		t.Errorf("a/f: %+v, %v: want owner 1000 and mtime 2 s", fst, err)
	}
	if tgt, err := os.Readlink(filepath.Join(dst, "l")); err != nil || tgt != "a/f" {
		t.Errorf("l: %q, %v", tgt, err)
	}
	var wst syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(dst, "w"), &wst); err != nil || wst.Mode&syscall.S_IFMT != syscall.S_IFCHR || wst.Rdev != 0 {
		t.Errorf("w is not a whiteout: %+v, %v", wst, err)
	}
	if v := xattr(t, filepath.Join(dst, "o"), xattrOpaque); v != "y" {
		t.Errorf("o's opaque xattr is %q", v)
	}
	if _, err := os.Lstat(filepath.Join(dst, "fifo")); !os.IsNotExist(err) {
		t.Errorf("the FIFO was made: %v", err)
	}

	// Incremental: a/f changed, l removed, a new file in a new directory.
	s.entries = []StateEntry{
		dirEntry(".", 1), dirEntry("a", 2), fileEntry("a/f", 3, 6, 3e9),
		{Path: "w", Mode: modeWh, Ino: 5},
		{Path: "o", Mode: modeDir, Ino: 6, Opaque: true, Mtime: 1e9}, fileEntry("o/g", 7, 3, 2e9),
		fileEntry("keep", 8, 4, 2e9),
		dirEntry("n", 10), fileEntry("n/new", 11, 1, 3e9),
	}
	s.content["a/f"], s.content["n/new"] = "hello!", "x"
	dst, _, st, err = s.capture(t, idx, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(s.reads, " ") != "a/f n/new" {
		t.Errorf("incremental capture read %v, want only a/f and n/new", s.reads)
	}
	if st.Whiteouts != 1 || st.Bytes != 7 {
		t.Errorf("incremental stats %+v, want 1 whiteout and 7 bytes", st)
	}
	if err := syscall.Lstat(filepath.Join(dst, "l"), &wst); err != nil || wst.Mode&syscall.S_IFMT != syscall.S_IFCHR {
		t.Errorf("the removed symlink has no whiteout: %+v, %v", wst, err)
	}
	for _, p := range []string{"keep", "o", "w"} {
		if _, err := os.Lstat(filepath.Join(dst, p)); !os.IsNotExist(err) {
			t.Errorf("unchanged %s copied again: %v", p, err)
		}
	}
}

func xattr(t *testing.T, p, name string) string {
	t.Helper()
	buf := make([]byte, 64)
	n, err := syscall.Getxattr(p, name, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// TestCaptureListingHostile: a guest's listing that breaks a rule is
// refused with a clear error before, or instead of, anything it names
// being made, and nothing is made outside the layer's tree.
func TestCaptureListingHostile(t *testing.T) {
	top := dirEntry(".", 1)
	for _, tc := range []struct {
		name     string
		entries  []StateEntry
		content  map[string]string
		maxBytes int64
		code     string
		want     string
	}{
		{"dot-dot", []StateEntry{top, fileEntry("../escape", 2, 1, 1)}, nil, 0, api.CodeStateInvalid, "not a clean relative path"},
		{"dot-dot inside", []StateEntry{top, dirEntry("a", 2), fileEntry("a/../../escape", 3, 1, 1)}, nil, 0, api.CodeStateInvalid, "not a clean relative path"},
		{"absolute", []StateEntry{top, fileEntry("/etc/passwd", 2, 1, 1)}, nil, 0, api.CodeStateInvalid, "not a clean relative path"},
		{"unclean", []StateEntry{top, dirEntry("a", 2), fileEntry("a//f", 3, 1, 1)}, nil, 0, api.CodeStateInvalid, "not a clean relative path"},
		{"empty", []StateEntry{top, fileEntry("", 2, 1, 1)}, nil, 0, api.CodeStateInvalid, "not a clean relative path"},
		{"long name", []StateEntry{top, fileEntry(strings.Repeat("n", 256), 2, 1, 1)}, nil, 0, api.CodeStateInvalid, "longer than 255"},
		{"duplicate", []StateEntry{top, fileEntry("f", 2, 1, 1), dirEntry("f", 3)}, nil, 0, api.CodeStateInvalid, "listed twice"},
		{"symlink parent", []StateEntry{top, {Path: "l", Mode: modeLink, Target: "/etc"}, fileEntry("l/passwd", 3, 1, 1)}, nil, 0, api.CodeStateInvalid, "not a listed directory"},
		{"file parent", []StateEntry{top, fileEntry("f", 2, 1, 1), fileEntry("f/g", 3, 1, 1)}, nil, 0, api.CodeStateInvalid, "not a listed directory"},
		{"missing parent", []StateEntry{top, fileEntry("a/b", 2, 1, 1)}, nil, 0, api.CodeStateInvalid, "not a listed directory"},
		{"no top", []StateEntry{dirEntry("a", 2)}, nil, 0, api.CodeStateInvalid, "top directory is not listed"},
		{"top not a directory", []StateEntry{fileEntry(".", 1, 1, 1)}, nil, 0, api.CodeStateInvalid, "top is not a directory"},
		{"device", []StateEntry{top, {Path: "sda", Mode: syscall.S_IFBLK | 0o600, Rdev: 8 << 8}}, nil, 0, api.CodeStateInvalid, "file type"},
		{"char device", []StateEntry{top, {Path: "mem", Mode: syscall.S_IFCHR | 0o600, Rdev: 1<<8 | 1}}, nil, 0, api.CodeStateInvalid, "device node"},
		{"bad type", []StateEntry{top, {Path: "x", Mode: 0o170000}}, nil, 0, api.CodeStateInvalid, "file type"},
		{"negative size", []StateEntry{top, fileEntry("f", 2, -1, 1)}, nil, 0, api.CodeStateInvalid, "negative size"},
		{"oversize", []StateEntry{top, fileEntry("f", 2, 600, 1), fileEntry("g", 3, 600, 1)}, nil, 1000, api.CodeSnapshotTooLarge, "more than 1000 bytes"},
		{"owner -1", []StateEntry{top, {Path: "f", Mode: modeFile, UID: 1<<32 - 1}}, nil, 0, api.CodeStateInvalid, "outside the ids"},
		{"symlink without target", []StateEntry{top, {Path: "l", Mode: modeLink}}, nil, 0, api.CodeStateInvalid, "no valid target"},
		{"short read", []StateEntry{top, fileEntry("f", 2, 10, 1)}, map[string]string{"f": "12345"}, 0, api.CodeStateInvalid, "gave 5 bytes, 10 listed"},
		{"long read", []StateEntry{top, fileEntry("f", 2, 5, 1)}, map[string]string{"f": "123456"}, 0, api.CodeStateInvalid, "more bytes than the 5 listed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &listedState{entries: tc.entries, content: tc.content}
			parent := t.TempDir()
			dst := filepath.Join(parent, "tree")
			_, _, err := CaptureState(context.Background(), CaptureOptions{
				Dst: dst, Overlay: true, Listing: s.entries, Read: s.read, MaxBytes: tc.maxBytes,
			})
			if err == nil {
				t.Fatal("the listing was accepted")
			}
			if errdefs.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q (code %s), want code %s saying %q", err, errdefs.CodeOf(err), tc.code, tc.want)
			}
			// Nothing beside the tree.
			if ents, _ := os.ReadDir(parent); len(ents) > 1 {
				t.Errorf("made beside the tree: %v", ents)
			}
			if _, err := os.Lstat(filepath.Join(parent, "escape")); !os.IsNotExist(err) {
				t.Errorf("a file escaped the tree: %v", err)
			}
		})
	}
}
