package function

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sandbox/sandboxtest"
	"github.com/dsec-dev/dsec/internal/testenv"
	"github.com/dsec-dev/dsec/internal/wasmtools"
)

// testCacheDir is one compilation cache for the whole test binary, so that
// each new runtime loads the tools instead of compiling them.
var testCacheDir string

func TestMain(m *testing.M) {
	testenv.SweepStale(30 * time.Minute)
	dir, err := os.MkdirTemp("", "dsec-function-cache-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testCacheDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// newRuntime returns a runtime over dir, closed with the test.
func newRuntime(t testing.TB, dir string, opts Options) *Runtime {
	t.Helper()
	opts.StateDir = dir
	if opts.CacheDir == "" {
		opts.CacheDir = testCacheDir
	}
	rt, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	return rt
}

// testImage is the default image built from the tool sources.
func testImage(t testing.TB) sandbox.Image {
	return sandbox.Image{ID: "img-function-test", Name: "function-default", Root: wasmtools.ForTest(t)}
}

func TestConformance(t *testing.T) {
	sandboxtest.Suite(t, sandboxtest.Factory{
		New: func(t *testing.T, dir string) sandbox.Runtime {
			return newRuntime(t, dir, Options{})
		},
		Image: testImage(t),
		Commands: sandboxtest.Commands{
			Echo:      func(args ...string) []string { return append([]string{"echo"}, args...) },
			Cat:       func() []string { return []string{"cat"} },
			Env:       func() []string { return []string{"env"} },
			Exit:      func(code int) []string { return []string{"exit", strconv.Itoa(code)} },
			Sleep:     func(s int) []string { return []string{"sleep", strconv.Itoa(s)} },
			Flood:     func() []string { return []string{"yes"} },
			ReadFile:  func(p string) []string { return []string{"cat", p} },
			WriteFile: func(p string) []string { return []string{"write", p} },
			AllocMB:   func(mb int) []string { return []string{"alloc", strconv.Itoa(mb)} },
		},
	})
}
