package cli

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// progressEvery is how often the progress line is redrawn.
const progressEvery = 200 * time.Millisecond

// progress counts the bytes of a transfer and, when it has a terminal to
// write to, redraws one line with the count, the share of the total (if
// known), the rate and the time taken. It is safe for concurrent use:
// net/http may read an upload's body on its own goroutine.
type progress struct {
	w     io.Writer // nil: count quietly
	label string
	total int64 // -1 if unknown
	now   func() time.Time
	start time.Time

	mu   sync.Mutex // guards following fields
	n    int64
	last time.Time
}

// newProgress returns a progress of a transfer of total bytes (-1:
// unknown) that draws on w if w is a terminal and --json is not set.
func (a *app) newProgress(w io.Writer, label string, total int64) *progress {
	p := &progress{label: label, total: total, now: a.env.now}
	if !a.json && a.env.isTerminal(w) {
		p.w = w
	}
	p.start = p.now()
	return p
}

func (p *progress) add(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n += int64(n)
	if p.w == nil {
		return
	}
	if now := p.now(); now.Sub(p.last) >= progressEvery {
		p.last = now
		p.drawLocked(now)
	}
}

// done draws the final line.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.w != nil {
		p.drawLocked(p.now())
		fmt.Fprintln(p.w)
	}
}

// Preconditions: p.mu must be held.
func (p *progress) drawLocked(now time.Time) {
	line := p.label + "  " + humanBytes(p.n)
	if p.total > 0 {
		line += fmt.Sprintf(" / %s (%d%%)", humanBytes(p.total), p.n*100/p.total)
	}
	elapsed := now.Sub(p.start)
	if secs := elapsed.Seconds(); secs > 0 {
		line += "  " + humanBytes(int64(float64(p.n)/secs)) + "/s"
	}
	line += "  " + formatElapsed(elapsed)
	// \r returns to the line's start, \x1b[K clears what a longer line left.
	fmt.Fprint(p.w, "\r"+line+"\x1b[K")
}

// formatElapsed formats the time a transfer has taken: 0.4s, 12.0s, 3m07s.
func formatElapsed(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", max(d, 0).Seconds())
	}
	d = d.Round(time.Second)
	return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
}

// progressReader counts what is read through it.
type progressReader struct {
	r io.Reader
	p *progress
}

func (r progressReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.p.add(n)
	return n, err
}

// sizedProgressReader is a progressReader that knows how much is left, so
// that the upload is sent with a Content-Length (see client.WriteFile).
type sizedProgressReader struct{ progressReader }

func (r sizedProgressReader) Len() int {
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	return int(r.p.total - r.p.n)
}
