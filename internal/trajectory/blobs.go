package trajectory

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Digest is the content address of b: "sha256:" and 64 hex digits.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func hexDigest(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

// OutputDigest is what replay compares of a command's output: sha256 over
// stdout, one 0 byte, then stderr, as "sha256:<hex>". It covers both
// streams whatever their size and wherever they are stored.
func OutputDigest(stdout, stderr string) string {
	h := sha256.New()
	io.WriteString(h, stdout)
	h.Write([]byte{0})
	io.WriteString(h, stderr)
	return hexDigest(h)
}

func validDigest(d string) bool {
	hx, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hx) != 64 {
		return false
	}
	_, err := hex.DecodeString(hx)
	return err == nil && strings.ToLower(hx) == hx
}

// spoolInMemory is the most of a blob PutBlob holds in memory; the rest
// goes to a temporary file while the digest is computed.
const spoolInMemory = 1 << 20

// PutBlob stores r's content as a blob of trajectory id and returns its
// digest and size. Blobs are content-addressed, so storing the same
// content again stores nothing (unless the stored copy is older than
// half the retention: it is written again, to live as long as the steps
// that name it). New bytes count towards Options.MaxBytes: TooLarge
// trajectory_full past it, and nothing is stored.
func (s *Store) PutBlob(ctx context.Context, id string, r io.Reader) (string, int64, error) {
	if err := ValidID(id); err != nil {
		return "", 0, err
	}
	room, err := s.room(ctx, id)
	if err != nil {
		return "", 0, err
	}
	sp, err := spool(r, room)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			return "", 0, full(id, s.opt.MaxBytes)
		}
		return "", 0, fmt.Errorf("reading blob for %s: %w", id, err)
	}
	defer sp.close()
	_, at, found, err := s.blobInfo(ctx, id, sp.digest)
	switch {
	case err != nil:
		return "", 0, fmt.Errorf("reading blob %s of %s: %w", sp.digest, id, err)
	case found && time.Since(at) < s.opt.Retention/2:
		return sp.digest, sp.n, nil
	}
	rd, err := sp.reader()
	if err != nil {
		return "", 0, fmt.Errorf("reading blob for %s: %w", id, err)
	}
	if err := s.putChunks(ctx, id, sp.digest, rd, sp.n); err != nil {
		return "", 0, fmt.Errorf("storing blob %s of %s: %w", sp.digest, id, err)
	}
	if !found { // a rewrite counted already
		s.addBytes(id, sp.n)
	}
	return sp.digest, sp.n, nil
}

// room returns how many bytes trajectory id may still take.
func (s *Store) room(ctx context.Context, id string) (int64, error) {
	t := s.traj(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.loaded {
		if err := s.loadLocked(ctx, id, t); err != nil {
			return 0, err
		}
	}
	return s.opt.MaxBytes - t.bytes, nil
}

func (s *Store) addBytes(id string, n int64) {
	t := s.traj(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bytes += n
	s.scheduleLocked(id, t)
}

var errTooLarge = errors.New("blob too large")

// spooled is a blob read once, with its digest: in memory, or in a
// temporary file past spoolInMemory.
type spooled struct {
	digest string
	n      int64
	mem    []byte
	file   *os.File
}

func spool(r io.Reader, max int64) (*spooled, error) {
	h := sha256.New()
	var buf bytes.Buffer
	n, err := io.Copy(io.MultiWriter(h, &buf), io.LimitReader(r, spoolInMemory+1))
	if err != nil {
		return nil, err
	}
	sp := &spooled{mem: buf.Bytes(), n: n}
	if n > spoolInMemory {
		f, err := os.CreateTemp("", "dsec-traj-blob-")
		if err != nil {
			return nil, err
		}
		os.Remove(f.Name()) // unnamed: nothing to clean up after a crash
		sp.file, sp.mem = f, nil
		if _, err := f.Write(buf.Bytes()); err != nil {
			sp.close()
			return nil, err
		}
		m, err := io.Copy(io.MultiWriter(h, f), io.LimitReader(r, max-n+1))
		sp.n += m
		if err != nil {
			sp.close()
			return nil, err
		}
	}
	if sp.n > max {
		sp.close()
		return nil, errTooLarge
	}
	sp.digest = hexDigest(h)
	return sp, nil
}

func (sp *spooled) reader() (io.Reader, error) {
	if sp.file == nil {
		return bytes.NewReader(sp.mem), nil
	}
	if _, err := sp.file.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return sp.file, nil
}

func (sp *spooled) close() {
	if sp.file != nil {
		sp.file.Close()
	}
}

// Blob opens a blob of trajectory id by digest and returns its size.
// NotFound blob_not_found if it is not stored; Invalid invalid_digest if
// digest is not one. The reader checks the content against the stored
// digest as it reads.
func (s *Store) Blob(ctx context.Context, id, digest string) (io.ReadCloser, int64, error) {
	if err := ValidID(id); err != nil {
		return nil, 0, err
	}
	if !validDigest(digest) {
		return nil, 0, errdefs.New(errdefs.Invalid, api.CodeInvalidDigest, "%q is not a digest (sha256:<64 hex digits>)", digest)
	}
	m, _, found, err := s.blobInfo(ctx, id, digest)
	if err != nil {
		return nil, 0, fmt.Errorf("reading blob %s of %s: %w", digest, id, err)
	}
	if !found {
		return nil, 0, errdefs.New(errdefs.NotFound, api.CodeBlobNotFound, "trajectory %q has no blob %s", id, digest)
	}
	return &chunkReader{ctx: ctx, s: s, base: blobBase(id, digest), chunks: m.Chunks}, m.Size, nil
}

// Outputs makes the result part of an exec step from res: each stream
// inline when it is at most inlineMax bytes (≤ 0: DefaultInlineMax),
// else stored as a blob and named by digest; OutputDigest always. The
// caller sets Request and StdinDigest (RedactExec).
func (s *Store) Outputs(ctx context.Context, id string, res api.ExecResult, inlineMax int) (api.StepExec, error) {
	if inlineMax <= 0 {
		inlineMax = DefaultInlineMax
	}
	e := api.StepExec{
		ExitCode: res.ExitCode, TimedOut: res.TimedOut,
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		OutputDigest: OutputDigest(res.Stdout, res.Stderr),
	}
	for _, o := range []struct {
		data         string
		inline, blob *string
	}{{res.Stdout, &e.Stdout, &e.StdoutBlob}, {res.Stderr, &e.Stderr, &e.StderrBlob}} {
		if len(o.data) <= inlineMax {
			*o.inline = o.data
			continue
		}
		d, _, err := s.PutBlob(ctx, id, strings.NewReader(o.data))
		if err != nil {
			return e, err
		}
		*o.blob = d
	}
	return e, nil
}
