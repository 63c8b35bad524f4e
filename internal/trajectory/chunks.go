package trajectory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Blobs live in a stream of their own, in chunks, one subject per chunk:
// dsec.trajblob.<key>.<hex>.<n>, and a last message, .m, that says the
// blob is whole (its size and chunk count). JetStream's object store
// would do, but its Put starts a goroutine of the client library that can
// be left waiting forever (it races with Put's own clean-up), one per
// put: a node that logs every step cannot have that.
const (
	StreamBlobs       = "DSEC_TRAJECTORY_BLOBS"
	blobSubjectPrefix = "dsec.trajblob."
	blobChunk         = 256 << 10
)

type blobMeta struct {
	Size   int64 `json:"size"`
	Chunks int   `json:"chunks"`
}

// blobBase is the subject prefix of one blob's messages.
func blobBase(id, digest string) string {
	return blobSubjectPrefix + key(id) + "." + strings.TrimPrefix(digest, "sha256:")
}

// blobInfo returns a stored blob's meta and when it was written; found is
// false if it is not (wholly) stored.
func (s *Store) blobInfo(ctx context.Context, id, digest string) (m blobMeta, at time.Time, found bool, err error) {
	msg, err := s.blobStream.GetLastMsgForSubject(ctx, blobBase(id, digest)+".m")
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return m, at, false, nil
	}
	if err != nil {
		return m, at, false, err
	}
	if err := json.Unmarshal(msg.Data, &m); err != nil {
		return m, at, false, fmt.Errorf("blob %s of %s: %w", digest, id, err)
	}
	return m, msg.Time, true, nil
}

// putChunks stores r (n bytes) as blob digest of id: the chunks, then
// the meta message, each acknowledged.
func (s *Store) putChunks(ctx context.Context, id, digest string, r io.Reader, n int64) error {
	base := blobBase(id, digest)
	buf := make([]byte, blobChunk)
	chunks := 0
	for done := int64(0); done < n; chunks++ {
		k, err := io.ReadFull(r, buf[:min(int64(len(buf)), n-done)])
		if err != nil {
			return err
		}
		if _, err := s.js.Publish(ctx, base+"."+strconv.Itoa(chunks), buf[:k]); err != nil {
			return err
		}
		done += int64(k)
	}
	b, _ := json.Marshal(blobMeta{Size: n, Chunks: chunks})
	_, err := s.js.Publish(ctx, base+".m", b)
	return err
}

// chunkReader reads a stored blob chunk by chunk.
type chunkReader struct {
	ctx    context.Context
	s      *Store
	base   string
	chunks int
	next   int
	cur    []byte
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.cur) == 0 {
		if c.next == c.chunks {
			return 0, io.EOF
		}
		msg, err := c.s.blobStream.GetLastMsgForSubject(c.ctx, c.base+"."+strconv.Itoa(c.next))
		if err != nil {
			return 0, fmt.Errorf("reading chunk %d of %s: %w", c.next, c.base, err)
		}
		c.cur, c.next = msg.Data, c.next+1
	}
	n := copy(p, c.cur)
	c.cur = c.cur[n:]
	return n, nil
}

func (c *chunkReader) Close() error { return nil }

// purgeBlobs removes every blob of trajectory id.
func (s *Store) purgeBlobs(ctx context.Context, id string) error {
	return s.blobStream.Purge(ctx, jetstream.WithPurgeSubject(blobSubjectPrefix+key(id)+".>"))
}
