// Package sandboxtest is the conformance suite for sandbox.Runtime. Every
// tier runs it unchanged from its own tests:
//
//	sandboxtest.Suite(t, sandboxtest.Factory{...})
//
// The suite only speaks through the contract; what differs between tiers
// (how to echo, how to exit with a code) comes from the factory's Commands.
package sandboxtest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Factory tells the suite how to make runtimes of the tier under test.
type Factory struct {
	// New returns a runtime over the state directory dir. Calling it again
	// with the same dir must give a runtime that can Recover what the first
	// one left (a node service restart).
	New func(t *testing.T, dir string) sandbox.Runtime
	// Image is the image sandboxes are created from; it must provide the
	// programs Commands names.
	Image sandbox.Image
	// Commands builds argv for the tier's programs.
	Commands Commands
}

// Commands builds the argv of small programs every tier's test image has.
type Commands struct {
	// Echo prints its arguments separated by spaces, then a newline.
	Echo func(args ...string) []string
	// Cat copies stdin to stdout.
	Cat func() []string
	// Env prints the environment, one NAME=value per line.
	Env func() []string
	// Exit exits with code.
	Exit func(code int) []string
	// Sleep sleeps seconds (it must also respond to being killed).
	Sleep func(seconds int) []string
	// Flood writes to stdout forever.
	Flood func() []string
	// ReadFile prints the file at path: absolute, inside the file root,
	// or relative to the command's working directory.
	ReadFile func(path string) []string
	// WriteFile writes stdin to the file at path (absolute or relative,
	// as ReadFile's).
	WriteFile func(path string) []string
	// AllocMB allocates and touches mb MiB of memory, then exits 0.
	AllocMB func(mb int) []string
	// MkFifo makes a FIFO at path; nil where the tier's programs cannot
	// (function: WebAssembly has no mknod), whose own tests then cover
	// reading one.
	MkFifo func(path string) []string
}

// Suite runs the conformance tests.
func Suite(t *testing.T, f Factory) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, f Factory)
	}{
		{"Fingerprint", testFingerprint},
		{"ExecEcho", testExecEcho},
		{"ExecExitCode", testExitCode},
		{"ExecStdin", testStdin},
		{"ExecEnv", testEnv},
		{"ExecCommandLine", testCommandLine},
		{"ExecStreams", testStreams},
		{"ExecOutputCap", testOutputCap},
		{"ExecTimeout", testTimeout},
		{"ExecRawOutput", testExecRawOutput},
		{"ExecContextCancel", testContextCancel},
		{"ExecMemoryLimit", testMemoryLimit},
		{"ExecConcurrent", testConcurrentExec},
		{"ExecBadRequest", testExecBadRequest},
		{"FilesRoundTrip", testFilesRoundTrip},
		{"FilesSeenByCommands", testFilesSeenByCommands},
		{"FilesListDepth", testFilesListDepth},
		{"FilesTraversal", testFilesTraversal},
		{"FilesErrors", testFilesErrors},
		{"FilesEdgeCases", testFilesEdgeCases},
		{"WorkdirWriteThenRun", testWorkdirWriteThenRun},
		{"WorkdirAbsolute", testWorkdirAbsolute},
		{"WorkdirCommandCwd", testWorkdirCommandCwd},
		{"WorkdirList", testWorkdirList},
		{"WorkdirPWD", testWorkdirPWD},
		{"Isolation", testIsolation},
		{"Processes", testProcesses},
		{"Destroy", testDestroy},
		{"Recover", testRecover},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, f) })
	}
}

// env is one runtime and helpers to make sandboxes on it.
type env struct {
	t   *testing.T
	f   Factory
	dir string
	rt  sandbox.Runtime
}

func newEnv(t *testing.T, f Factory) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, f: f, dir: dir, rt: f.New(t, dir)}
	t.Cleanup(func() {
		if err := e.rt.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

var nextID atomic.Int64

func (e *env) spec() sandbox.Spec {
	return sandbox.Spec{
		ID:       sandboxID(e.t, int(nextID.Add(1))),
		Tier:     e.rt.Tier(),
		Image:    e.f.Image,
		CPU:      1,
		MemoryMB: 256,
		DiskMB:   64,
	}
}

func (e *env) create(spec sandbox.Spec) sandbox.Sandbox {
	e.t.Helper()
	sb, err := e.rt.Create(context.Background(), spec)
	if err != nil {
		e.t.Fatalf("Create: %v", err)
	}
	e.t.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil {
			e.t.Errorf("Destroy: %v", err)
		}
	})
	return sb
}

func (e *env) newSandbox() sandbox.Sandbox {
	e.t.Helper()
	return e.create(e.spec())
}
