package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/dsec-dev/dsec/api"
)

const (
	// defaultCommandTimeout is the server's default run time of a command.
	defaultCommandTimeout = 60 * time.Second
	// maxEventSize caps one streamed event (a line or a message).
	maxEventSize = 64 << 20
)

// errNoExit is wrapped when a command stream ends before its exit event.
var errNoExit = errors.New("command stream ended before the exit event")

// commandTime is how long the server may run a command of req.
func commandTime(timeoutS float64) time.Duration {
	if timeoutS <= 0 {
		return defaultCommandTimeout
	}
	return time.Duration(timeoutS * float64(time.Second))
}

// Exec runs a command in the sandbox id and waits for it. A command that
// runs and fails is no error: see the result's ExitCode, TimedOut and Error.
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest) (*api.ExecResult, error) {
	p, err := sandboxPath(id, "/exec")
	if err != nil {
		return nil, err
	}
	var res api.ExecResult
	if err := c.call(ctx, http.MethodPost, p, req, &res, commandTime(req.TimeoutS)); err != nil {
		return nil, err
	}
	return &res, nil
}

// ExecStream runs a command in the sandbox id and passes each event of its
// NDJSON stream (start, stdout and stderr chunks, exit) to fn, in order, as
// it arrives; fn may be nil. If fn returns an error the stream is abandoned
// and that error returned. The result is the exit event's, whose Stdout and
// Stderr are empty. An error event ends the stream with an *Error; a stream
// that ends without an exit event is an error wrapping io.ErrUnexpectedEOF.
func (c *Client) ExecStream(ctx context.Context, id string, req api.ExecRequest, fn func(api.ExecEvent) error) (*api.ExecResult, error) {
	p, err := sandboxPath(id, "/exec/stream")
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encoding request: %w", err)
	}
	ctx, cancel := c.withTimeout(ctx, commandTime(req.TimeoutS))
	defer cancel()
	resp, err := c.send(ctx, &request{method: http.MethodPost, path: p, body: body, accept: hdrNDJSON, ctype: hdrJSON})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	br := c.lines.Get().(*bufio.Reader)
	br.Reset(resp.Body)
	defer func() {
		br.Reset(nil)
		c.lines.Put(br)
	}()
	res, err := readNDJSON(br, fn)
	if err == nil {
		// Let the connection be reused: the server ends the body after exit.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	}
	return res, err
}

// readNDJSON reads events, one JSON object a line, until an exit or error
// event.
func readNDJSON(br *bufio.Reader, fn func(api.ExecEvent) error) (*api.ExecResult, error) {
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			line, err = readLongLine(br, line)
		}
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("reading command stream: %w", err)
		}
		if line = bytes.TrimSpace(line); len(line) > 0 {
			var ev api.ExecEvent
			if uerr := json.Unmarshal(line, &ev); uerr != nil {
				if err == io.EOF { // a line cut short
					return nil, fmt.Errorf("%w: %w", errNoExit, io.ErrUnexpectedEOF)
				}
				return nil, fmt.Errorf("decoding command event: %w", uerr)
			}
			if res, done, herr := handleEvent(&ev, fn); done || herr != nil {
				return res, herr
			}
		}
		if err == io.EOF {
			return nil, fmt.Errorf("%w: %w", errNoExit, io.ErrUnexpectedEOF)
		}
	}
}

// readLongLine finishes a line longer than br's buffer, of which first is
// the start.
func readLongLine(br *bufio.Reader, first []byte) ([]byte, error) {
	line := append([]byte(nil), first...)
	for {
		more, err := br.ReadSlice('\n')
		line = append(line, more...)
		if len(line) > maxEventSize {
			return nil, fmt.Errorf("command event longer than %d bytes", maxEventSize)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}

// handleEvent passes ev to fn and, once ev ends the stream, reports done
// with the command's result or error.
func handleEvent(ev *api.ExecEvent, fn func(api.ExecEvent) error) (res *api.ExecResult, done bool, err error) {
	if ev.Type == api.EventExit && ev.Result == nil {
		return nil, true, errors.New("command exit event without a result")
	}
	if fn != nil {
		if err := fn(*ev); err != nil {
			return nil, true, err
		}
	}
	switch ev.Type {
	case api.EventExit:
		return ev.Result, true, nil
	case api.EventError:
		return nil, true, eventError(ev.Error)
	}
	return nil, false, nil
}
