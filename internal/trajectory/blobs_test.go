package trajectory

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

func readBlob(t *testing.T, s *Store, id, digest string) []byte {
	t.Helper()
	rc, n, err := s.Blob(ctxT(t), id, digest)
	if err != nil {
		t.Fatalf("Blob(%s): %v", digest, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil || int64(len(b)) != n {
		t.Fatalf("reading blob %s: %d bytes of %d, %v", digest, len(b), n, err)
	}
	return b
}

// TestOutputs: a stream up to the inline limit stays in the step, a
// longer one becomes a blob; the output digest covers both, whatever
// their size, and is the same for the same output.
func TestOutputs(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	ctx := ctxT(t)
	begin(t, s, "out", "o")
	small := "hello\n"
	big := strings.Repeat("e", 100)
	res := api.ExecResult{ExitCode: 3, Stdout: small, Stderr: big, StderrTruncated: true}
	e, err := s.Outputs(ctx, "out", res, 100) // stderr exactly at the limit: inline
	if err != nil || e.Stdout != small || e.Stderr != big || e.StdoutBlob != "" || e.StderrBlob != "" {
		t.Fatalf("at the limit: %+v, %v", e, err)
	}
	h := sha256.Sum256([]byte(small + "\x00" + big))
	if want := "sha256:" + hex.EncodeToString(h[:]); e.OutputDigest != want {
		t.Fatalf("OutputDigest = %s, want sha256(stdout, 0, stderr) = %s", e.OutputDigest, want)
	}
	if e.ExitCode != 3 || !e.StderrTruncated {
		t.Fatalf("result fields lost: %+v", e)
	}
	before, _, _ := s.Head(ctx, "out")
	e2, err := s.Outputs(ctx, "out", res, 99) // one byte over: a blob
	if err != nil || e2.Stderr != "" || e2.StderrBlob != Digest([]byte(big)) || e2.Stdout != small {
		t.Fatalf("over the limit: %+v, %v", e2, err)
	}
	if e2.OutputDigest != e.OutputDigest {
		t.Fatalf("the output digest depends on where the output is kept: %s, %s", e.OutputDigest, e2.OutputDigest)
	}
	if got := readBlob(t, s, "out", e2.StderrBlob); string(got) != big {
		t.Fatalf("blob holds %q", got)
	}
	mid, _, _ := s.Head(ctx, "out")
	if mid.Bytes != before.Bytes+int64(len(big)) {
		t.Fatalf("bytes %d after storing %d, were %d", mid.Bytes, len(big), before.Bytes)
	}
	// The same output again: the same blob, stored once.
	if e3, err := s.Outputs(ctx, "out", res, 99); err != nil || e3.StderrBlob != e2.StderrBlob || e3.OutputDigest != e2.OutputDigest {
		t.Fatalf("the same output again: %+v, %v", e3, err)
	}
	if after, _, _ := s.Head(ctx, "out"); after.Bytes != mid.Bytes {
		t.Fatalf("storing a blob again counted %d more bytes", after.Bytes-mid.Bytes)
	}
	if OutputDigest("a\n", "") == OutputDigest("", "a\n") {
		t.Fatal("the output digest does not tell stdout from stderr")
	}
}

// TestBlobs: content addressing, a blob larger than what is held in
// memory, and the errors of a read.
func TestBlobs(t *testing.T) {
	js, _ := newJS(t)
	s := openStore(t, js, Options{})
	ctx := ctxT(t)
	begin(t, s, "b", "o")
	big := bytes.Repeat([]byte("0123456789abcdef"), (3*spoolInMemory)/16+7)
	d, n, err := s.PutBlob(ctx, "b", bytes.NewReader(big))
	if err != nil || d != Digest(big) || n != int64(len(big)) {
		t.Fatalf("PutBlob = %s, %d, %v", d, n, err)
	}
	if got := readBlob(t, s, "b", d); !bytes.Equal(got, big) {
		t.Fatal("a large blob came back different")
	}
	missing := Digest([]byte("never stored"))
	if _, _, err := s.Blob(ctx, "b", missing); !errors.Is(err, errdefs.NotFound) || errdefs.CodeOf(err) != api.CodeBlobNotFound {
		t.Errorf("a missing blob: err = %v", err)
	}
	if _, _, err := s.Blob(ctx, "other", d); errdefs.CodeOf(err) != api.CodeBlobNotFound {
		t.Errorf("another trajectory's blob: err = %v, want %s", err, api.CodeBlobNotFound)
	}
	for _, bad := range []string{"", "sha256:xyz", "md5:" + strings.Repeat("0", 64), "sha256:" + strings.Repeat("A", 64), "sha256:../" + strings.Repeat("0", 61)} {
		if _, _, err := s.Blob(ctx, "b", bad); errdefs.CodeOf(err) != api.CodeInvalidDigest {
			t.Errorf("Blob(%q): err = %v, want %s", bad, err, api.CodeInvalidDigest)
		}
	}
	if _, _, err := s.PutBlob(ctx, "no-head", strings.NewReader("x")); errdefs.CodeOf(err) != api.CodeTrajectoryNotFound {
		t.Errorf("a blob for a trajectory without a head: err = %v", err)
	}
}
