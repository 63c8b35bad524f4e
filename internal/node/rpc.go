package node

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
)

// opTimeout bounds operations other than exec and process waits.
const opTimeout = 2 * time.Minute

// dispatch runs one request on its own goroutine, bounded by sem, so that
// a slow exec does not hold up other sandboxes' requests.
func (a *Service) dispatch(ctx context.Context, m *nats.Msg) {
	op := strings.TrimPrefix(m.Subject, "dsec.node."+a.opt.ID+".")
	select {
	case a.sem <- struct{}{}:
	default:
		a.replyErr(m, &errdefs.Error{Class: errdefs.Unavailable, Code: api.CodeNodeBusy,
			Msg: fmt.Sprintf("node %s is handling too many requests", a.opt.ID), RetryAfter: time.Second})
		return
	}
	a.dmu.Lock()
	if a.stopping {
		a.dmu.Unlock()
		<-a.sem
		a.replyErr(m, &errdefs.Error{Class: errdefs.Unavailable, Code: api.CodeNodeBusy,
			Msg: fmt.Sprintf("node %s is stopping", a.opt.ID), RetryAfter: time.Second})
		return
	}
	a.wg.Add(1)
	a.dmu.Unlock()
	go func() {
		defer a.wg.Done()
		defer func() { <-a.sem }()
		a.handle(ctx, op, m)
	}()
}

func (a *Service) handle(ctx context.Context, op string, m *nats.Msg) {
	switch op {
	case noderpc.OpExec:
		a.handleExec(ctx, m)
		return
	case noderpc.OpCancel:
		var req noderpc.CancelRequest
		if json.Unmarshal(m.Data, &req) == nil {
			a.cancelCall(req.Call)
		}
		return
	case noderpc.OpFileRead:
		a.handleRead(ctx, m)
		return
	case noderpc.OpFileWrite:
		a.handleWrite(ctx, m)
		return
	case noderpc.OpSnapshot:
		var req noderpc.SnapshotRequest
		if err := decode(m.Data, &req); err != nil {
			a.replyErr(m, err)
			return
		}
		ctx, cancel := context.WithTimeout(ctx, noderpc.SnapshotTimeout)
		defer cancel()
		res, err := a.Snapshot(ctx, req)
		a.reply(m, res, err)
		return
	case noderpc.OpStored:
		var req noderpc.StoredRequest
		if err := decode(m.Data, &req); err != nil {
			a.replyErr(m, err)
			return
		}
		ctx, cancel := context.WithTimeout(ctx, noderpc.SnapshotTimeout)
		defer cancel()
		res, err := a.Stored(ctx, req)
		a.reply(m, res, err)
		return
	case noderpc.OpProcWait:
		var req noderpc.ProcRequest
		if err := decode(m.Data, &req); err != nil {
			a.replyErr(m, err)
			return
		}
		res, err := a.procWait(ctx, req)
		a.reply(m, res, err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	h, ok := a.simpleOps()[op]
	if !ok {
		a.replyErr(m, errdefs.New(errdefs.Unsupported, api.CodeUnknownOperation, "node %s does not know operation %q", a.opt.ID, op))
		return
	}
	resp, err := h(ctx, m.Data)
	a.reply(m, resp, err)
}

// simpleOps are the request → one reply operations.
func (a *Service) simpleOps() map[string]func(context.Context, []byte) (any, error) {
	return map[string]func(context.Context, []byte) (any, error){
		noderpc.OpCreate:     a.createOp,
		noderpc.OpDestroy:    jsonOp(func(ctx context.Context, t noderpc.Target) error { return a.Destroy(ctx, t.ID) }),
		noderpc.OpList:       func(context.Context, []byte) (any, error) { return noderpc.ListResponse{Sandboxes: a.List()}, nil },
		noderpc.OpProcStart:  jsonOpR(a.procStart),
		noderpc.OpProcList:   jsonOpR(a.procList),
		noderpc.OpProcGet:    jsonOpR(a.procGet),
		noderpc.OpProcStdin:  jsonOp(a.procStdin),
		noderpc.OpProcClose:  jsonOp(a.procCloseStdin),
		noderpc.OpProcSignal: jsonOp(a.procSignal),
		noderpc.OpFileOpen:   jsonOpR(a.fileOpen),
		noderpc.OpFileClose:  jsonOp(a.fileClose),
		noderpc.OpFileList:   jsonOpR(a.fileList),
		noderpc.OpFileStat:   jsonOpR(a.fileStat),
		noderpc.OpFileMkdir:  jsonOpR(a.fileMkdir),
		noderpc.OpFileRemove: jsonOp(a.fileRemove),
		noderpc.OpFileRename: jsonOpR(a.fileRename),
		noderpc.OpStats:      jsonOpR(a.stats),
		noderpc.OpSetPhase:   jsonOp(a.setPhase),
	}
}

func decode(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return errdefs.Wrap(errdefs.Invalid, api.CodeBadRequest, err, "malformed node request")
	}
	return nil
}

func jsonOp[T any](fn func(context.Context, T) error) func(context.Context, []byte) (any, error) {
	return func(ctx context.Context, data []byte) (any, error) {
		var req T
		if err := decode(data, &req); err != nil {
			return nil, err
		}
		return nil, fn(ctx, req)
	}
}

func jsonOpR[T, R any](fn func(context.Context, T) (R, error)) func(context.Context, []byte) (any, error) {
	return func(ctx context.Context, data []byte) (any, error) {
		var req T
		if err := decode(data, &req); err != nil {
			return nil, err
		}
		return fn(ctx, req)
	}
}

func (a *Service) reply(m *nats.Msg, resp any, err error) {
	if err != nil {
		a.replyErr(m, err)
		return
	}
	var body []byte
	if resp != nil {
		if body, err = json.Marshal(resp); err != nil {
			a.replyErr(m, err)
			return
		}
	}
	a.send(m, &nats.Msg{Data: body})
}

func (a *Service) replyErr(m *nats.Msg, err error) {
	if errdefs.ClassOf(err) == errdefs.Internal {
		a.log.Error("request failed", "subject", m.Subject, "err", err)
	}
	out := &nats.Msg{}
	noderpc.EncodeError(out, err)
	a.send(m, out)
}

func (a *Service) send(m *nats.Msg, out *nats.Msg) {
	if m.Reply == "" {
		return
	}
	if err := m.RespondMsg(out); err != nil {
		a.log.Warn("replying", "subject", m.Subject, "err", err)
	}
}
