//go:build linux

package agent_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
)

// TestFilesConfinedToRoot: symlinks inside the root cannot lead the files
// API out of it, whatever they point at.
func TestFilesConfinedToRoot(t *testing.T) {
	c, r := newAgent(t, agent.Options{})
	ctx := ctxT(t, 30*time.Second)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(r.root, "workspace")
	for name, target := range map[string]string{
		"abs":      outside,
		"rel":      "../../" + filepath.Base(filepath.Dir(outside)) + "/" + filepath.Base(outside),
		"dotdot":   "../..",
		"loop":     "loop",
		"etc":      "/etc",
		"fileLink": filepath.Join(outside, "secret"),
	} {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"/workspace/abs/secret", "/workspace/rel/secret", "/workspace/etc/passwd"} {
		if rc, _, err := c.Open(ctx, p); err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			if strings.Contains(string(b), "host secret") || strings.Contains(string(b), "root:") {
				t.Errorf("Open(%s) read outside the root: %q", p, b)
			}
		}
		if _, err := c.Write(ctx, p, strings.NewReader("x"), agentproto.WriteOptions{}); err == nil {
			t.Errorf("Write(%s) through a symlink succeeded", p)
		}
	}
	if rc, _, err := c.Open(ctx, "/workspace/fileLink"); err == nil {
		rc.Close()
		t.Error("Open through a symlink to a file outside succeeded")
	}
	// A write to a symlink replaces the link (rename over it), inside.
	if _, err := c.Write(ctx, "/workspace/fileLink", strings.NewReader("mine"), agentproto.WriteOptions{}); err != nil {
		t.Errorf("Write over a symlink: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "host secret" {
		t.Errorf("the symlink's target outside the root was changed: %q", b)
	}
	if _, err := c.Write(ctx, "/workspace/abs/new", strings.NewReader("x"), agentproto.WriteOptions{Parents: true}); err == nil {
		t.Error("Write under an escaping symlink succeeded")
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); err == nil {
		t.Error("a file was written outside the root")
	}
	// Stat describes the link itself.
	fi, err := c.Stat(ctx, "/workspace/abs")
	if err != nil || fi.Type != api.FileTypeSymlink || fi.Target != outside || fi.Path != "/workspace/abs" {
		t.Errorf("Stat(symlink) = %+v, %v", fi, err)
	}
	// Removing a link removes the link, not its target.
	if err := c.Remove(ctx, "/workspace/abs", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(outside, "secret")); err != nil {
		t.Errorf("removing a symlink touched its target: %v", err)
	}
	if err := c.Remove(ctx, "/", true); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("Remove(/): err = %v, want Invalid", err)
	}
}

func TestFilesListing(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	ctx := ctxT(t, 30*time.Second)
	// Enough entries to span several chunks of the listing.
	for i := range 600 {
		name := "/workspace/many/" + strings.Repeat("x", 40) + string(rune('a'+i%26)) + "-" + itoa(i)
		if _, err := c.Write(ctx, name, strings.NewReader("x"), agentproto.WriteOptions{Parents: true}); err != nil {
			t.Fatal(err)
		}
	}
	list, err := c.List(ctx, "/workspace/many", 1)
	if err != nil || len(list) != 600 {
		t.Fatalf("List = %d entries, %v", len(list), err)
	}
	for i := 1; i < len(list); i++ {
		if list[i-1].Path >= list[i].Path {
			t.Fatalf("not sorted at %d: %s, %s", i, list[i-1].Path, list[i].Path)
		}
	}
	if fi := list[0]; fi.Type != api.FileTypeFile || fi.Size != 1 || !strings.HasPrefix(fi.Path, "/workspace/many/") || fi.Mode != 0o644 {
		t.Errorf("entry %+v", fi)
	}
	deep := "/workspace/deep"
	for range 40 {
		deep += "/d"
	}
	if _, err := c.Mkdir(ctx, deep, true); err != nil {
		t.Fatal(err)
	}
	list, err = c.List(ctx, "/workspace/deep", 1000)
	if err != nil || len(list) != 32 {
		t.Errorf("List depth 1000 = %d entries, %v; want depth capped at 32", len(list), err)
	}
	if _, err := c.List(ctx, "/workspace/missing", 1); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("List missing: %v", err)
	}
}

func itoa(i int) string {
	return strings.TrimLeft(string([]byte{byte('0' + i/100%10), byte('0' + i/10%10), byte('0' + i%10)}), "")
}

func TestFilesStreamLarge(t *testing.T) {
	c, r := newAgent(t, agent.Options{})
	ctx := ctxT(t, 60*time.Second)
	data := bytes.Repeat([]byte("0123456789abcdef"), 2<<20) // 32 MiB
	fi, err := c.Write(ctx, "/workspace/big", bytes.NewReader(data), agentproto.WriteOptions{Mode: 0o600})
	if err != nil || fi.Size != int64(len(data)) || fi.Mode != 0o600 {
		t.Fatalf("Write = %+v, %v", fi, err)
	}
	rc, fi, err := c.Open(ctx, "/workspace/big")
	if err != nil || fi.Size != int64(len(data)) {
		t.Fatalf("Open = %+v, %v", fi, err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
	// Closing a download early stops it; the connection goes on.
	rc, _, err = c.Open(ctx, "/workspace/big")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	if _, err := io.ReadFull(rc, buf); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if _, err := rc.Read(buf); err == nil {
		t.Error("Read after Close succeeded")
	}
	if _, err := c.Stat(ctx, "/workspace/big"); err != nil {
		t.Fatal(err)
	}
	// No temporary files are left behind.
	entries, _ := os.ReadDir(filepath.Join(r.root, "workspace"))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".dsec-write-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

// TestFilesDiskFull: ENOSPC is TooLarge "workspace_full", and the
// partial file is removed.
func TestFilesDiskFull(t *testing.T) {
	root := t.TempDir()
	if err := syscall.Mount("tmpfs", root, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(root, syscall.MNT_DETACH) })
	c, _ := newAgent(t, agent.Options{Root: root})
	_, err := c.Write(ctxT(t, 30*time.Second), "/full", bytes.NewReader(make([]byte, 4<<20)), agentproto.WriteOptions{})
	if !errors.Is(err, errdefs.TooLarge) || errdefs.CodeOf(err) != "workspace_full" {
		t.Errorf("err = %v (%s), want TooLarge workspace_full", err, errdefs.CodeOf(err))
	}
	entries, _ := os.ReadDir(root)
	if len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
}

func TestStats(t *testing.T) {
	c, _ := newAgent(t, agent.Options{})
	ctx := ctxT(t, 30*time.Second)
	p, err := c.Start(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "10"}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pid != os.Getpid() || st.Tracked != 1 || st.Background != 1 || st.Connections != 1 || st.AgentRSSBytes <= 0 || st.MemTotalBytes <= 0 || st.Processes < 2 || st.AgentVersion != "test" {
		t.Errorf("Stats = %+v", st)
	}
	c.Signal(ctx, p.Pid, "KILL")
	c.Wait(ctx, p.Pid)
}

// TestFilesDownloadBoundedBySize: a download ends at the size the file
// had when it was opened, however much is appended meanwhile (a log
// being written would otherwise stream for as long as it grows).
func TestFilesDownloadBoundedBySize(t *testing.T) {
	c, r := newAgent(t, agent.Options{})
	ctx := ctxT(t, 60*time.Second)
	host := filepath.Join(r.root, "workspace", "growing")
	first := bytes.Repeat([]byte("a"), 4<<20)
	if err := os.WriteFile(host, first, 0o644); err != nil {
		t.Fatal(err)
	}
	rc, fi, err := c.Open(ctx, "/workspace/growing")
	if err != nil || fi.Size != int64(len(first)) {
		t.Fatalf("Open = %+v, %v", fi, err)
	}
	defer rc.Close()
	f, err := os.OpenFile(host, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(bytes.Repeat([]byte("b"), 8<<20))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(got, first) {
		t.Errorf("download = %d bytes (%d past the size at open), %v; want the %d bytes of the open", len(got), len(got)-len(first), err, len(first))
	}
}
