package node

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// execStream sends the messages of one exec reply in order, numbering
// them. It is safe for concurrent use (stdout and stderr writers).
type execStream struct {
	a   *Service
	req *nats.Msg

	mu  sync.Mutex // guards following fields
	seq int
}

func (s *execStream) sendLocked(kind string, data []byte) {
	s.seq++
	s.a.send(s.req, &nats.Msg{
		Header: nats.Header{noderpc.HdrKind: []string{kind}, noderpc.HdrSeq: []string{strconv.Itoa(s.seq)}},
		Data:   data,
	})
}

// chunks sends data as messages of at most ChunkSize bytes.
func (s *execStream) chunks(kind string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(data) > 0 {
		n := min(len(data), noderpc.ChunkSize)
		s.sendLocked(kind, data[:n])
		data = data[n:]
	}
}

func (s *execStream) exit(res api.ExecResult, info *noderpc.StepInfo) {
	body, _ := json.Marshal(noderpc.ExitMessage{ExecResult: res, StepInfo: info})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sendLocked(api.EventExit, body)
}

// streamWriter forwards output as it is produced.
type streamWriter struct {
	s    *execStream
	kind string
}

func (w streamWriter) Write(p []byte) (int, error) {
	// The message owns its data once published; copy out of the caller's
	// buffer, which it reuses.
	w.s.chunks(w.kind, append([]byte(nil), p...))
	return len(p), nil
}

func (a *Service) handleExec(ctx context.Context, m *nats.Msg) {
	var req noderpc.ExecRequest
	if err := decode(m.Data, &req); err != nil {
		a.replyErr(m, err)
		return
	}
	sb, tier, err := a.lookup(req.ID)
	if err != nil {
		a.replyErr(m, err)
		return
	}
	// The command's own timeout is enforced by the runtime; this bound
	// only frees the handler if a runtime fails to.
	ctx, cancel := context.WithTimeout(ctx, time.Duration(req.Req.TimeoutS*float64(time.Second))+time.Minute)
	defer cancel()
	if req.Call != "" {
		a.mu.Lock()
		a.calls[req.Call] = cancel
		a.mu.Unlock()
		defer func() {
			a.mu.Lock()
			delete(a.calls, req.Call)
			a.mu.Unlock()
		}()
	}
	stream := &execStream{a: a, req: m}
	sreq := sandbox.ExecRequest{ExecRequest: req.Req}
	if req.Stream {
		sreq.Stdout = streamWriter{stream, api.EventStdout}
		sreq.Stderr = streamWriter{stream, api.EventStderr}
	}
	a.beginStepAt(req.ID, req.Step)
	var step *stepTrack
	if req.Track {
		if step, err = a.beginStep(ctx, sb, tier); err != nil {
			a.replyErr(m, err)
			return
		}
	}
	res, err := sb.Exec(ctx, sreq)
	if err != nil {
		a.replyErr(m, err)
		return
	}
	var info *noderpc.StepInfo
	if step != nil {
		info = a.endStep(ctx, sb, step)
	}
	if req.Stream {
		res.Stdout, res.Stderr = "", ""
	} else if len(res.Stdout)+len(res.Stderr) > noderpc.InlineOutput {
		// Large output goes ahead in chunks so that no message exceeds
		// what a NATS server accepts.
		stream.chunks(api.EventStdout, []byte(res.Stdout))
		stream.chunks(api.EventStderr, []byte(res.Stderr))
		res.Stdout, res.Stderr = "", ""
	}
	stream.exit(res, info)
}

func (a *Service) cancelCall(call string) {
	a.mu.Lock()
	cancel := a.calls[call]
	a.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}
