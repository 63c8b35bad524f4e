package function

import (
	"bytes"
	"errors"
	"io"
	"strings"

	"github.com/dsec-dev/dsec/internal/sandbox"
)

// errCallEnded is what a guest reading stdin sees once its call has ended.
var errCallEnded = errors.New("call ended")

// callStdin returns the reader a call's guest reads, and a function to
// call when the call ends. In-memory readers are used as they are; any
// other reader (a network stream) is read by a goroutine so that a guest
// blocked on it still stops at its timeout.
func callStdin(req *sandbox.ExecRequest, done <-chan struct{}) (io.Reader, func()) {
	switch r := req.Stdin.(type) {
	case nil:
		if req.ExecRequest.Stdin == "" {
			return nil, func() {}
		}
		return strings.NewReader(req.ExecRequest.Stdin), func() {}
	case *strings.Reader, *bytes.Reader, *bytes.Buffer:
		return r, func() {}
	default:
		p := &pump{src: r, done: done, ch: make(chan chunk), quit: make(chan struct{})}
		return p, p.stop
	}
}

type chunk struct {
	data []byte
	err  error
}

// pump reads src in a goroutine started on the first Read. After stop the
// goroutine exits as soon as its current Read of src returns. A pump is
// read by one goroutine at a time.
type pump struct {
	src     io.Reader
	done    <-chan struct{}
	ch      chan chunk
	quit    chan struct{}
	started bool
	rest    []byte
	err     error
}

func (p *pump) Read(b []byte) (int, error) {
	for len(p.rest) == 0 {
		if p.err != nil {
			return 0, p.err
		}
		if !p.started {
			p.started = true
			go p.run()
		}
		select {
		case c := <-p.ch:
			p.rest, p.err = c.data, c.err
		case <-p.done:
			p.err = errCallEnded
		}
	}
	n := copy(b, p.rest)
	p.rest = p.rest[n:]
	return n, nil
}

func (p *pump) run() {
	for {
		buf := make([]byte, 32<<10)
		n, err := p.src.Read(buf)
		select {
		case p.ch <- chunk{buf[:n], err}:
		case <-p.quit:
			return
		}
		if err != nil {
			return
		}
	}
}

func (p *pump) stop() { close(p.quit) }
