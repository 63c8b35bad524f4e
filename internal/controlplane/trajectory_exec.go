package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/store"
	"github.com/dsec-dev/dsec/internal/trajectory"
)

// inlineOutput is the most of each output stream a step keeps in the log
// itself; more goes to the trajectory's blob store.
const inlineOutput = 16 << 10

// recordedExec runs an exec of a recorded sandbox as its next step: the
// node tracks whether it changed the sandbox's state, and the command,
// its result and that verdict are logged before the caller hears of it.
func (m *Manager) recordedExec(ctx context.Context, r *recording, rec store.SandboxRecord, req api.ExecRequest, out *noderpc.Output) (api.ExecResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	logged, stdinDigest := redactExec(req, rec.SecretEnv)
	if r.ff != nil {
		if st, ok := r.ff.matchExec(logged, stdinDigest); ok {
			return m.loggedResult(ctx, r.traj, st, out)
		}
		r.ff = nil
	}
	if err := m.traj.Room(ctx, r.traj); err != nil {
		return api.ExecResult{}, err
	}
	if err := m.keepStdin(ctx, r.traj, req.Stdin, stdinDigest); err != nil {
		return api.ExecResult{}, err
	}
	// Streamed output goes to the caller as it comes and is kept (up to
	// the request's cap, as the result would) for the log.
	var cap capture
	if out != nil {
		out = cap.tee(out, req.MaxOutputBytes)
	}
	start := time.Now()
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.setAbort(cancel)
	defer r.setAbort(nil)
	res, info, err := m.nodes.ExecStep(cctx, rec.Node, rec.ID, r.next, req, out)
	if err != nil {
		c := errdefs.ClassOf(err)
		if errors.Is(context.Cause(cctx), errPreempted) || rec.ResumeOnPreempt && (c == errdefs.Unavailable || c == errdefs.DeadlineExceeded) && ctx.Err() == nil {
			return res, &errdefs.Error{Class: errdefs.Unavailable, Code: api.CodeTrajectoryInFlight, Cause: err, RetryAfter: time.Second,
				Msg: "the sandbox's node did not finish the command, which is not logged as done: retry it once the sandbox is resumed"}
		}
		return res, err
	}
	full := res
	if out != nil {
		full.Stdout, full.Stderr = cap.stdout.String(), cap.stderr.String()
	}
	se, err := m.traj.Outputs(ctx, r.traj, full, inlineOutput)
	if err != nil {
		return res, err
	}
	se.Request, se.StdinDigest = logged, stdinDigest
	st := api.TrajectoryStep{
		Kind: api.KindExec, Exec: &se, Pure: info.Tracked && info.Pure,
		At: start.UTC(), DurationMS: float64(time.Since(start).Microseconds()) / 1000,
	}
	if err := m.appendStep(ctx, r, rec, &st); err != nil {
		return res, err
	}
	return res, nil
}

// loggedResult answers an exec from the log (fast-forward).
func (m *Manager) loggedResult(ctx context.Context, traj string, st api.TrajectoryStep, out *noderpc.Output) (api.ExecResult, error) {
	se := st.Exec
	res := api.ExecResult{
		ExitCode: se.ExitCode, TimedOut: se.TimedOut, DurationMS: st.DurationMS,
		StdoutTruncated: se.StdoutTruncated, StderrTruncated: se.StderrTruncated,
	}
	var err error
	if res.Stdout, err = m.stepOutput(ctx, traj, se.Stdout, se.StdoutBlob); err != nil {
		return res, err
	}
	if res.Stderr, err = m.stepOutput(ctx, traj, se.Stderr, se.StderrBlob); err != nil {
		return res, err
	}
	if out != nil {
		if out.Stdout != nil && res.Stdout != "" {
			out.Stdout([]byte(res.Stdout))
		}
		if out.Stderr != nil && res.Stderr != "" {
			out.Stderr([]byte(res.Stderr))
		}
		res.Stdout, res.Stderr = "", ""
	}
	return res, nil
}

// stepOutput is one stream of a logged exec: inline, or from its blob.
func (m *Manager) stepOutput(ctx context.Context, traj, inline, blob string) (string, error) {
	if blob == "" {
		return inline, nil
	}
	rc, _, err := m.traj.Blob(ctx, traj, blob)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	var b capBuffer
	b.max = 1 << 30
	if _, err := b.ReadFrom(rc); err != nil {
		return "", err
	}
	return b.String(), nil
}

// capture keeps a copy of streamed output, up to a cap per stream.
type capture struct {
	mu             sync.Mutex // guards following fields
	stdout, stderr capBuffer
}

func (c *capture) tee(out *noderpc.Output, max int) *noderpc.Output {
	c.stdout.max, c.stderr.max = max, max
	t := &noderpc.Output{}
	t.Stdout = func(b []byte) {
		c.mu.Lock()
		c.stdout.add(b)
		c.mu.Unlock()
		if out.Stdout != nil {
			out.Stdout(b)
		}
	}
	t.Stderr = func(b []byte) {
		c.mu.Lock()
		c.stderr.add(b)
		c.mu.Unlock()
		if out.Stderr != nil {
			out.Stderr(b)
		}
	}
	return t
}

// fastForward answers the requests of a resumed sandbox that match its
// log, in order, from the log: the state they made is there already.
// The first request that differs ends it.
type fastForward struct {
	steps []api.TrajectoryStep // the logged steps after the create
	i     int
}

// next is the next logged step a request could match, skipping what no
// request makes (snapshots, resumes, ends).
func (f *fastForward) next() (api.TrajectoryStep, bool) {
	for f.i < len(f.steps) {
		st := f.steps[f.i]
		switch st.Kind {
		case api.KindSnapshot, api.KindResume, api.KindEnd, api.KindCreate:
			f.i++
			continue
		}
		return st, true
	}
	return api.TrajectoryStep{}, false
}

func (f *fastForward) matchExec(req api.ExecRequest, stdinDigest string) (api.TrajectoryStep, bool) {
	st, ok := f.next()
	if !ok || st.Kind != api.KindExec || st.Exec.Process || !sameExec(st.Exec.Request, req) || st.Exec.StdinDigest != stdinDigest {
		return st, false
	}
	f.i++
	return st, true
}

// match reports whether a non-exec step is the log's next one.
func (f *fastForward) match(st *api.TrajectoryStep) bool {
	got, ok := f.next()
	if !ok || got.Kind != st.Kind {
		return false
	}
	same := false
	switch st.Kind {
	case api.KindWrite, api.KindMkdir, api.KindRemove, api.KindRename:
		same = *got.File == *st.File
	case api.KindPhase:
		same = *got.Phase == *st.Phase
	case api.KindExec: // a process start
		same = got.Exec.Process && st.Exec.Process && sameExec(got.Exec.Request, st.Exec.Request) && got.Exec.StdinDigest == st.Exec.StdinDigest
	}
	if same {
		f.i++
	}
	return same
}

// sameExec compares what a command is: what runs, where, with what
// environment. Timeouts and output caps do not change what it does.
func sameExec(a, b api.ExecRequest) bool {
	return slices.Equal(a.Cmd, b.Cmd) && a.Command == b.Command && a.Cwd == b.Cwd && maps.Equal(a.Env, b.Env)
}

// redactExec is the request as logged: stdin by its digest, and the
// values of the sandbox's secret env keys blanked (a replay fills them
// in from the resume's secret env).
func redactExec(req api.ExecRequest, secret []string) (api.ExecRequest, string) {
	out, digest := trajectory.RedactExec(req)
	cloned := false
	for _, k := range secret {
		if _, ok := out.Env[k]; ok {
			if !cloned {
				out.Env, cloned = maps.Clone(out.Env), true
			}
			out.Env[k] = ""
		}
	}
	return out, digest
}

// capBuffer keeps up to max bytes of what is added.
type capBuffer struct {
	bytes.Buffer
	max int
}

func (b *capBuffer) add(p []byte) {
	if room := b.max - b.Len(); room > 0 {
		b.Write(p[:min(len(p), room)])
	}
}

// keepStdin stores a command's stdin in the trajectory's blob store, so
// that a replay can give it again (the step has only its digest).
func (m *Manager) keepStdin(ctx context.Context, traj, stdin, digest string) error {
	if stdin == "" {
		return nil
	}
	got, _, err := m.traj.PutBlob(ctx, traj, strings.NewReader(stdin))
	if err == nil && got != digest {
		err = fmt.Errorf("stdin stored as %s, logged as %s", got, digest)
	}
	return err
}
