package node

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// sessionIdle is how long an unused read or write session lives.
const sessionIdle = time.Minute

// readSession is an open file being downloaded in chunks. Reads are
// sequential; the reader asks for the offset it expects so that a retried
// or duplicated request is detected.
// cancelOnClose ends a download's context when the download is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

type readSession struct {
	sandbox string
	f       io.ReadCloser
	off     int64
	used    time.Time
	busy    bool
}

// writeSession is an upload in progress: chunks are piped into the
// sandbox's atomic Files.Write, which runs on its own goroutine.
type writeSession struct {
	sandbox string
	pw      *io.PipeWriter
	done    chan struct{}
	info    api.FileInfo
	err     error
	used    time.Time
	busy    bool
}

func (w *writeSession) abort() {
	w.pw.CloseWithError(errdefs.New(errdefs.Unavailable, api.CodeUploadAborted, "upload aborted"))
	<-w.done
}

func (a *Service) files(id string) (sandbox.Files, error) {
	sb, _, err := a.lookup(id)
	if err != nil {
		return nil, err
	}
	return sb.Files(), nil
}

func (a *Service) fileList(ctx context.Context, r noderpc.FileRequest) (api.FileList, error) {
	fs, err := a.files(r.ID)
	if err != nil {
		return api.FileList{}, err
	}
	entries, err := fs.List(ctx, r.Path, r.Depth)
	if entries == nil {
		entries = []api.FileInfo{}
	}
	return api.FileList{Entries: entries}, err
}

func (a *Service) fileStat(ctx context.Context, r noderpc.FileRequest) (api.FileInfo, error) {
	fs, err := a.files(r.ID)
	if err != nil {
		return api.FileInfo{}, err
	}
	return fs.Stat(ctx, r.Path)
}

func (a *Service) fileMkdir(ctx context.Context, r noderpc.FileRequest) (api.FileInfo, error) {
	fs, err := a.files(r.ID)
	if err != nil {
		return api.FileInfo{}, err
	}
	a.beginStepAt(r.ID, r.Step)
	defer a.ownChange(r.ID)
	return fs.Mkdir(ctx, r.Path, r.Parents)
}

func (a *Service) fileRemove(ctx context.Context, r noderpc.FileRequest) error {
	fs, err := a.files(r.ID)
	if err != nil {
		return err
	}
	a.beginStepAt(r.ID, r.Step)
	defer a.ownChange(r.ID)
	return fs.Remove(ctx, r.Path, r.Recursive)
}

func (a *Service) fileRename(ctx context.Context, r noderpc.FileRequest) (api.FileInfo, error) {
	fs, err := a.files(r.ID)
	if err != nil {
		return api.FileInfo{}, err
	}
	a.beginStepAt(r.ID, r.Step)
	defer a.ownChange(r.ID)
	return fs.Rename(ctx, r.Path, r.To)
}

func (a *Service) fileOpen(ctx context.Context, r noderpc.FileRequest) (noderpc.OpenResponse, error) {
	fs, err := a.files(r.ID)
	if err != nil {
		return noderpc.OpenResponse{}, err
	}
	// The download outlives this RPC (its reads are later RPCs): its
	// context ends when the session is closed, not when the open returns.
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f, info, err := fs.Open(octx, r.Path)
	if err != nil {
		cancel()
		return noderpc.OpenResponse{}, err
	}
	f = cancelOnClose{ReadCloser: f, cancel: cancel}
	h := nats.NewInbox()[len("_INBOX."):]
	a.mu.Lock()
	a.reads[h] = &readSession{sandbox: r.ID, f: f, used: time.Now()}
	a.mu.Unlock()
	return noderpc.OpenResponse{Handle: h, Info: info}, nil
}

func (a *Service) fileClose(ctx context.Context, r noderpc.FileRequest) error {
	a.mu.Lock()
	rs := a.reads[r.Handle]
	delete(a.reads, r.Handle)
	ws := a.writes[r.Handle]
	delete(a.writes, r.Handle)
	a.mu.Unlock()
	if rs != nil {
		rs.f.Close()
	}
	if ws != nil {
		ws.abort()
	}
	return nil
}

// handleRead sends the next chunk of an open file.
func (a *Service) handleRead(ctx context.Context, m *nats.Msg) {
	var r noderpc.FileRequest
	if err := decode(m.Data, &r); err != nil {
		a.replyErr(m, err)
		return
	}
	a.mu.Lock()
	rs := a.reads[r.Handle]
	if rs == nil || rs.sandbox != r.ID || rs.busy {
		a.mu.Unlock()
		a.replyErr(m, errdefs.New(errdefs.NotFound, api.CodeFileHandleNotFound, "file handle expired or unknown"))
		return
	}
	rs.busy = true
	a.mu.Unlock()
	if r.Offset != rs.off {
		a.finishRead(r.Handle, rs, true)
		a.replyErr(m, errdefs.New(errdefs.Invalid, api.CodeBadOffset, "read at offset %d, expected %d", r.Offset, rs.off))
		return
	}
	buf := make([]byte, noderpc.ChunkSize)
	n, err := io.ReadFull(rs.f, buf)
	eof := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
	if err != nil && !eof {
		a.finishRead(r.Handle, rs, true)
		a.replyErr(m, err)
		return
	}
	rs.off += int64(n)
	out := &nats.Msg{Data: buf[:n]}
	if eof {
		out.Header = nats.Header{noderpc.HdrEOF: []string{"1"}}
	}
	a.finishRead(r.Handle, rs, eof)
	a.send(m, out)
}

func (a *Service) finishRead(h string, rs *readSession, closeIt bool) {
	a.mu.Lock()
	rs.busy, rs.used = false, time.Now()
	if closeIt {
		delete(a.reads, h)
	}
	a.mu.Unlock()
	if closeIt {
		rs.f.Close()
	}
}

// handleWrite takes one chunk of an upload. The first chunk opens the
// session; the final one completes the write and returns the file's info.
func (a *Service) handleWrite(ctx context.Context, m *nats.Msg) {
	var r noderpc.FileRequest
	if err := decode([]byte(m.Header.Get(noderpc.HdrReq)), &r); err != nil {
		a.replyErr(m, err)
		return
	}
	h := r.Handle
	var ws *writeSession
	if h == "" {
		fs, err := a.files(r.ID)
		if err != nil {
			a.replyErr(m, err)
			return
		}
		a.beginStepAt(r.ID, r.Step)
		h = nats.NewInbox()[len("_INBOX."):]
		ws = a.startWrite(r, fs)
		a.mu.Lock()
		a.writes[h] = ws
		ws.busy = true
		a.mu.Unlock()
	} else {
		a.mu.Lock()
		ws = a.writes[h]
		if ws == nil || ws.sandbox != r.ID || ws.busy {
			a.mu.Unlock()
			a.replyErr(m, errdefs.New(errdefs.NotFound, api.CodeFileHandleNotFound, "upload handle expired or unknown"))
			return
		}
		ws.busy = true
		a.mu.Unlock()
	}
	_, werr := ws.pw.Write(m.Data)
	if werr == nil && !r.Final {
		a.mu.Lock()
		ws.busy, ws.used = false, time.Now()
		a.mu.Unlock()
		a.reply(m, noderpc.WriteResponse{Handle: h}, nil)
		return
	}
	// Final chunk, or the writer already failed: finish the session.
	ws.pw.Close()
	<-ws.done
	a.mu.Lock()
	delete(a.writes, h)
	a.mu.Unlock()
	a.ownChange(ws.sandbox)
	if ws.err != nil {
		a.replyErr(m, ws.err)
		return
	}
	info := ws.info
	a.reply(m, noderpc.WriteResponse{Handle: h, Info: &info}, nil)
}

func (a *Service) startWrite(r noderpc.FileRequest, fs sandbox.Files) *writeSession {
	pr, pw := io.Pipe()
	ws := &writeSession{sandbox: r.ID, pw: pw, done: make(chan struct{}), used: time.Now()}
	opt := sandbox.WriteOptions{Mode: r.Mode, Parents: r.Parents, MaxBytes: r.MaxBytes}
	go func() {
		defer close(ws.done)
		// The write outlives single requests; sessions are bounded by the
		// idle janitor instead of a request context.
		ws.info, ws.err = fs.Write(context.Background(), r.Path, pr, opt)
		// Unblock a chunk writer if Write gave up early (e.g. too large).
		pr.CloseWithError(errWriteDone)
	}()
	return ws
}

var errWriteDone = errors.New("write finished")

// endSessions closes the read and write sessions of sandbox id.
func (a *Service) endSessions(id string) {
	var reads []*readSession
	var writes []*writeSession
	a.mu.Lock()
	for h, r := range a.reads {
		if r.sandbox == id {
			reads = append(reads, r)
			delete(a.reads, h)
		}
	}
	for h, w := range a.writes {
		if w.sandbox == id {
			writes = append(writes, w)
			delete(a.writes, h)
		}
	}
	a.mu.Unlock()
	for _, r := range reads {
		r.f.Close()
	}
	for _, w := range writes {
		w.abort()
	}
}

// janitor expires idle file sessions and collects unused layers.
func (a *Service) janitor(ctx context.Context) {
	defer a.wg.Done()
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			a.expireSessions(now)
			if a.opt.Layers != nil && n%3 == 0 {
				// Unused mounts linger up to 30 s, so that a burst of
				// creates and deletes of one image does not remount it.
				if err := a.opt.Layers.GC(ctx); err != nil && ctx.Err() == nil {
					a.log.Warn("collecting unused layers", "err", err)
				}
			}
		}
	}
}

func (a *Service) expireSessions(now time.Time) {
	var reads []*readSession
	var writes []*writeSession
	a.mu.Lock()
	for h, r := range a.reads {
		if !r.busy && now.Sub(r.used) > sessionIdle {
			reads = append(reads, r)
			delete(a.reads, h)
		}
	}
	for h, w := range a.writes {
		if !w.busy && now.Sub(w.used) > sessionIdle {
			writes = append(writes, w)
			delete(a.writes, h)
		}
	}
	a.mu.Unlock()
	for _, r := range reads {
		r.f.Close()
	}
	for _, w := range writes {
		w.abort()
	}
}

// ownChange drops sandbox id's step mark after a change the node made
// for a call of its own (a file written, moved, removed; a phase): see
// sandbox.MarkDropper.
func (a *Service) ownChange(id string) {
	if sb, _, err := a.lookup(id); err == nil {
		if d, ok := sb.(sandbox.MarkDropper); ok {
			d.DropMark()
		}
	}
}
