package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	wire "github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
)

func (s *Server) exec(w http.ResponseWriter, r *http.Request, owner string) {
	var req wire.ExecRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.mgr.Exec(r.Context(), owner, r.PathValue("id"), req, nil)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// eventSink turns output chunks into ExecEvents. Chunks may split a UTF-8
// sequence; the sink holds back an incomplete tail until the next chunk so
// that JSON strings do not turn it into replacement characters.
type eventSink struct {
	mu   sync.Mutex // guards following fields
	emit func(wire.ExecEvent) error
	tail map[string][]byte
	err  error
}

func newEventSink(emit func(wire.ExecEvent) error) *eventSink {
	return &eventSink{emit: emit, tail: map[string][]byte{}}
}

func (k *eventSink) chunk(kind string, p []byte) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		return
	}
	buf := append(k.tail[kind], p...)
	cut := len(buf)
	// Hold back at most 3 bytes of an unfinished rune.
	for i := len(buf) - 1; i >= 0 && i >= len(buf)-3; i-- {
		if utf8.RuneStart(buf[i]) {
			if !utf8.FullRune(buf[i:]) {
				cut = i
			}
			break
		}
	}
	k.tail[kind] = append([]byte(nil), buf[cut:]...)
	if cut > 0 {
		k.err = k.emit(wire.ExecEvent{Type: kind, Data: string(buf[:cut])})
	}
}

// flush emits what is held back; called before the exit event.
func (k *eventSink) flush() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, kind := range []string{wire.EventStdout, wire.EventStderr} {
		if t := k.tail[kind]; len(t) > 0 && k.err == nil {
			k.err = k.emit(wire.ExecEvent{Type: kind, Data: string(t)})
		}
	}
	return k.err
}

func (k *eventSink) output() *noderpc.Output {
	return &noderpc.Output{
		Stdout: func(p []byte) { k.chunk(wire.EventStdout, p) },
		Stderr: func(p []byte) { k.chunk(wire.EventStderr, p) },
	}
}

// runStreamed runs the exec and emits its events: start, output, then
// exit or error.
func (s *Server) runStreamed(ctx context.Context, owner, id string, req wire.ExecRequest, emit func(wire.ExecEvent) error) {
	if err := emit(wire.ExecEvent{Type: wire.EventStart}); err != nil {
		return
	}
	sink := newEventSink(emit)
	res, err := s.mgr.Exec(ctx, owner, id, req, sink.output())
	if ferr := sink.flush(); ferr != nil {
		return // the client is gone
	}
	if err != nil {
		_, body := wireError(err)
		s.opt.Metrics.Error(body.Code)
		_ = emit(wire.ExecEvent{Type: wire.EventError, Error: &body})
		return
	}
	_ = emit(wire.ExecEvent{Type: wire.EventExit, Result: &res})
}

func (s *Server) execStream(w http.ResponseWriter, r *http.Request, owner string) {
	var req wire.ExecRequest
	if err := s.decode(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	// Refuse up front what would fail before running, so that such errors
	// are plain HTTP errors rather than a stream with one error event.
	if _, err := s.mgr.Get(owner, id); err != nil {
		s.writeError(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	s.runStreamed(r.Context(), owner, id, req, func(ev wire.ExecEvent) error {
		if err := enc.Encode(ev); err != nil {
			return err
		}
		return rc.Flush()
	})
}

func (s *Server) execWS(w http.ResponseWriter, r *http.Request, owner string) {
	id := r.PathValue("id")
	if _, err := s.mgr.Get(owner, id); err != nil {
		s.writeError(w, r, err)
		return
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{})
	if err != nil {
		return // Accept has answered the client
	}
	defer c.CloseNow()
	c.SetReadLimit(s.opt.MaxBodyBytes)
	ctx := r.Context()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, msg, err := c.Read(rctx)
	cancel()
	if err != nil {
		c.Close(websocket.StatusPolicyViolation, "expected an exec request")
		return
	}
	var req wire.ExecRequest
	if err := json.Unmarshal(msg, &req); err != nil {
		_, body := wireError(errdefs.New(errdefs.Invalid, wire.CodeInvalidJSON, "exec request is not valid JSON: %v", err))
		b, _ := json.Marshal(wire.ExecEvent{Type: wire.EventError, Error: &body})
		_ = c.Write(ctx, websocket.MessageText, b)
		c.Close(websocket.StatusUnsupportedData, "invalid request")
		return
	}
	s.runStreamed(ctx, owner, id, req, func(ev wire.ExecEvent) error {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		return c.Write(ctx, websocket.MessageText, b)
	})
	c.Close(websocket.StatusNormalClosure, "")
}
