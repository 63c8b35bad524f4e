package controlplane

import (
	"context"
	"io"
	"path"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/store"
)

// recordedWrite writes a file of a recorded sandbox as a step: its
// content goes to the node and, as it passes, to the trajectory's blob
// store by digest, so a replay can write it again.
func (m *Manager) recordedWrite(ctx context.Context, rec store.SandboxRecord, path string, r io.Reader, opt noderpc.FileRequest) (api.FileInfo, error) {
	rc, err := m.recording(ctx, rec)
	if err != nil {
		return api.FileInfo{}, err
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err := m.traj.Room(ctx, rc.traj); err != nil {
		return api.FileInfo{}, err
	}
	if rc.ff != nil {
		return m.fastForwardWrite(ctx, rc, rec, path, r, opt)
	}
	// The blob store reads what the node is sent, through a pipe.
	pr, pw := io.Pipe()
	type put struct {
		digest string
		n      int64
		err    error
	}
	done := make(chan put, 1)
	go func() {
		d, n, err := m.traj.PutBlob(context.WithoutCancel(ctx), rc.traj, pr)
		_ = pr.CloseWithError(err) // unblocks the writer if the store failed
		done <- put{d, n, err}
	}()
	start := time.Now()
	fi, werr := m.nodes.WriteFile(ctx, rec.Node, rec.ID, path, io.TeeReader(r, pw), opt)
	if werr == nil {
		// The node read up to its cap, not necessarily to EOF: what it
		// wrote is what the log keeps, so the rest is not sent.
		werr = pw.Close()
	} else {
		_ = pw.CloseWithError(werr)
	}
	p := <-done
	if werr != nil {
		return fi, werr
	}
	if p.err != nil {
		return fi, p.err
	}
	st := api.TrajectoryStep{
		Kind: api.KindWrite, At: start.UTC(), DurationMS: float64(time.Since(start).Microseconds()) / 1000,
		File: &api.StepFile{Path: path, Digest: p.digest, Size: p.n, Mode: opt.Mode, Parents: opt.Parents},
	}
	return fi, m.appendStep(ctx, rc, rec, &st)
}

// fastForwardWrite is a write to a resumed sandbox that is fast-forwarding
// (rc.mu held): the content goes to the blob store first, and if the log's
// next step is this very write, nothing else happens (the file was made
// by the replay, and a later logged step may have changed it since).
// Otherwise the fast-forward ends and the content is written from the
// blob store, as a step.
func (m *Manager) fastForwardWrite(ctx context.Context, rc *recording, rec store.SandboxRecord, p string, r io.Reader, opt noderpc.FileRequest) (api.FileInfo, error) {
	digest, n, err := m.traj.PutBlob(ctx, rc.traj, io.LimitReader(r, opt.MaxBytes+1))
	if err != nil {
		return api.FileInfo{}, err
	}
	if n > opt.MaxBytes {
		return api.FileInfo{}, errdefs.New(errdefs.TooLarge, api.CodeFileTooLarge, "the file is larger than %d bytes", opt.MaxBytes)
	}
	st := api.TrajectoryStep{Kind: api.KindWrite, File: &api.StepFile{Path: p, Digest: digest, Size: n, Mode: opt.Mode, Parents: opt.Parents}}
	if rc.ff.match(&st) {
		return api.FileInfo{Name: path.Base(p), Path: p, Type: "file", Size: n, Mode: opt.Mode}, nil
	}
	rc.ff = nil
	blob, _, err := m.traj.Blob(ctx, rc.traj, digest)
	if err != nil {
		return api.FileInfo{}, err
	}
	defer blob.Close()
	start := time.Now()
	fi, err := m.nodes.WriteFile(ctx, rec.Node, rec.ID, p, blob, opt)
	if err != nil {
		return fi, err
	}
	st.At, st.DurationMS = start.UTC(), float64(time.Since(start).Microseconds())/1000
	return fi, m.appendStep(ctx, rc, rec, &st)
}
