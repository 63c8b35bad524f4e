package blobstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func digestOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func TestLocalStore(t *testing.T) {
	s, err := NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	testStore(t, s)
}

func TestNATSStore(t *testing.T) {
	nc, _ := testenv.NATS(t)
	s, err := NewNATS(context.Background(), nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	testStore(t, s)
}

// testStore is the behaviour every Store shares.
func testStore(t *testing.T, s Store) {
	testRanges(t, s)
	ctx := context.Background()
	content := strings.Repeat("0123456789", 1000)
	d := digestOf(content)
	info, err := s.Put(ctx, d, strings.NewReader(content))
	if err != nil || info.Size != int64(len(content)) {
		t.Fatalf("Put = %+v, %v", info, err)
	}
	if _, err := s.Put(ctx, d, strings.NewReader(content)); err != nil {
		t.Errorf("second Put: %v", err)
	}
	r, err := s.ReadRange(ctx, d, 995, 10)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if string(b) != "5678901234" {
		t.Errorf("ReadRange = %q", b)
	}
	rc, info, err := s.Open(ctx, d)
	if err != nil || info.Size != int64(len(content)) {
		t.Fatal(err)
	}
	all, _ := io.ReadAll(rc)
	rc.Close()
	if string(all) != content {
		t.Error("Open returned other content")
	}
	if l, err := s.List(ctx); err != nil || len(l) != 1 || l[0].Digest != d {
		t.Errorf("List = %+v, %v", l, err)
	}
	if _, err := s.Put(ctx, digestOf("other"), strings.NewReader("not other")); !errors.Is(err, errdefs.Invalid) {
		t.Errorf("Put with a wrong digest: %v, want Invalid", err)
	}
	if _, err := s.Stat(ctx, digestOf("other")); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("a refused Put left a blob: %v", err)
	}
	for _, bad := range []string{"", "sha256:abc", "md5:" + strings.Repeat("0", 32), "sha256:../../etc/passwd" + strings.Repeat("0", 40)} {
		if _, err := s.Stat(ctx, bad); !errors.Is(err, errdefs.Invalid) {
			t.Errorf("Stat(%q): %v, want Invalid", bad, err)
		}
	}
	if err := s.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, d); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if _, _, err := s.Open(ctx, d); !errors.Is(err, errdefs.NotFound) {
		t.Errorf("Open after Delete: %v", err)
	}
}

// TestNATSRanges reads ranges across chunk boundaries of a multi-chunk
// blob.
func TestNATSRanges(t *testing.T) {
	nc, _ := testenv.NATS(t)
	s, err := NewNATS(context.Background(), nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b := make([]byte, 3*natsChunk+1234)
	for i := range b {
		b[i] = byte(i * 7)
	}
	d := digestOf(string(b))
	if _, err := s.Put(ctx, d, strings.NewReader(string(b))); err != nil {
		t.Fatal(err)
	}
	for _, r := range [][2]int64{{0, 10}, {natsChunk - 5, 10}, {natsChunk, natsChunk * 2}, {int64(len(b)) - 3, 100}, {int64(len(b)) + 5, 10}} {
		rc, err := s.ReadRange(ctx, d, r[0], r[1])
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		lo, hi := min(r[0], int64(len(b))), min(r[0]+r[1], int64(len(b)))
		if err != nil || string(got) != string(b[lo:hi]) {
			t.Errorf("ReadRange(%d, %d): %d bytes, %v", r[0], r[1], len(got), err)
		}
	}
	rc, info, err := s.Open(ctx, d)
	if err != nil || info.Size != int64(len(b)) {
		t.Fatal(err)
	}
	all, _ := io.ReadAll(rc)
	if string(all) != string(b) {
		t.Error("Open returned other content")
	}
}

// testRanges reads a blob of several of the NATS store's 512 KiB chunk
// messages whole and in ranges across their boundaries, and closes a
// reader half-way (its read-ahead must not outlive it).
func testRanges(t *testing.T, s Store) {
	ctx := context.Background()
	content := testenv.RandBytes(9, 3<<20+12345)
	sum := sha256.Sum256(content)
	d := "sha256:" + hex.EncodeToString(sum[:])
	if _, err := s.Put(ctx, d, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	goroutines := testenv.Goroutines()
	rc, _, err := s.Open(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(b, content) {
		t.Fatalf("Open: %d bytes, %v; want the %d put", len(b), err, len(content))
	}
	for _, r := range [][2]int64{{0, 1}, {512<<10 - 3, 7}, {100, 2 << 20}, {1<<20 + 5, 1 << 20}, {int64(len(content)) - 10, 100}, {int64(len(content)), 5}} {
		rc, err := s.ReadRange(ctx, d, r[0], r[1])
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		want := content[min(r[0], int64(len(content))):min(r[0]+r[1], int64(len(content)))]
		if err != nil || !bytes.Equal(b, want) {
			t.Errorf("ReadRange(%d, %d): %d bytes, %v; want %d", r[0], r[1], len(b), err, len(want))
		}
	}
	rc, err = s.ReadRange(ctx, d, 0, int64(len(content)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(rc, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	testenv.GoroutinesSettle(t, goroutines)
	if err := s.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
}

// TestNATSPutWindow: a blob of more chunks than a Put keeps in flight
// reads back byte for byte (each chunk's buffer is reused while earlier
// ones are unacknowledged).
func TestNATSPutWindow(t *testing.T) {
	nc, _ := testenv.NATS(t)
	s, err := NewNATS(context.Background(), nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b := make([]byte, (2*putWindow+3)*natsChunk+77)
	for i := range b {
		b[i] = byte(i/natsChunk*31 + i*7)
	}
	d := digestOf(string(b))
	if _, err := s.Put(ctx, d, strings.NewReader(string(b))); err != nil {
		t.Fatal(err)
	}
	rc, _, err := s.Open(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(got) != string(b) {
		t.Fatalf("read back %d bytes (%v), want the %d put", len(got), err, len(b))
	}
}
