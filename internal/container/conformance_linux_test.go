package container

import (
	"testing"

	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sandbox/sandboxtest"
)

var sh = sandboxtest.Sh

// busyboxCommands are the conformance suite's programs in the busybox
// image.
var busyboxCommands = sandboxtest.Busybox

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
