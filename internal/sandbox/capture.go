package sandbox

import (
	"bytes"
	"io"
	"sync"
)

// DefaultOutputCap is the default cap on each of stdout and stderr.
const DefaultOutputCap = 4 << 20

// Capture collects a command's output stream up to a cap, optionally
// forwarding it to a live stream (up to the same cap). Past the cap it
// drops bytes and marks itself truncated; it never fails a write, so a
// program that floods its output is not killed by a write error but by its
// timeout. It is safe for concurrent use.
type Capture struct {
	mu        sync.Mutex // guards following fields
	limit     int
	buf       bytes.Buffer
	seen      int
	stream    io.Writer
	keep      bool
	truncated bool
}

// NewCapture returns a Capture with the given cap (≤ 0: DefaultOutputCap).
// If keep is false only the stream receives output (streaming exec, where
// the client already has it).
func NewCapture(limit int, stream io.Writer, keep bool) *Capture {
	if limit <= 0 {
		limit = DefaultOutputCap
	}
	return &Capture{limit: limit, stream: stream, keep: keep}
}

// Write implements io.Writer and always reports len(p) written.
func (c *Capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	room := c.limit - c.seen
	if room <= 0 {
		c.truncated = c.truncated || n > 0
		return n, nil
	}
	if len(p) > room {
		p = p[:room]
		c.truncated = true
	}
	c.seen += len(p)
	if c.keep {
		c.buf.Write(p)
	}
	if c.stream != nil {
		if _, err := c.stream.Write(p); err != nil {
			// The reader went away; keep capturing, stop streaming.
			c.stream = nil
		}
	}
	return n, nil
}

// Result returns what was kept and whether anything was dropped.
func (c *Capture) Result() (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String(), c.truncated
}
