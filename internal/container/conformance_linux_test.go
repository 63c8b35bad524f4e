package container

import (
	"strconv"
	"testing"

	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sandbox/sandboxtest"
)

func sh(script string, args ...string) []string {
	return append([]string{"/bin/sh", "-c", script, "sh"}, args...)
}

// busyboxCommands are the conformance suite's programs in the busybox
// image.
var busyboxCommands = sandboxtest.Commands{
	Echo:      func(args ...string) []string { return append([]string{"echo"}, args...) },
	Cat:       func() []string { return []string{"cat"} },
	Env:       func() []string { return []string{"env"} },
	Exit:      func(code int) []string { return sh("exit " + strconv.Itoa(code)) },
	Sleep:     func(s int) []string { return []string{"sleep", strconv.Itoa(s)} },
	Flood:     func() []string { return []string{"yes"} },
	ReadFile:  func(p string) []string { return []string{"cat", "--", p} },
	WriteFile: func(p string) []string { return sh(`exec cat > "$1"`, p) },
	// A shell variable of mb MiB: the shell touches every byte of it.
	AllocMB: func(mb int) []string {
		return sh(`x=$(head -c "$1"m /dev/zero | tr '\0' a) && test ${#x} -gt 0`, strconv.Itoa(mb))
	},
}

func TestConformance(t *testing.T) {
	w := world.get(t)
	sandboxtest.Suite(t, sandboxtest.Factory{
		New: func(t *testing.T, dir string) sandbox.Runtime {
			t.Cleanup(func() { checkHost(t, dir) }) // after the runtime's own cleanup
			return newRuntime(t, dir, runtimeOptions{})
		},
		Image:    w.image(),
		Commands: busyboxCommands,
	})
}
