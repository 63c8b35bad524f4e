// Command dsec-guest is DSec's in-sandbox agent: PID 1 of a container
// sandbox. It is a small static binary, reached by sandboxes through the
// read-only toolkit/dsec-guest layer (/opt/dsec/bin/dsec-guest).
package main

import (
	"context"
	"os"

	"github.com/dsec-dev/dsec/internal/guest"
	"github.com/dsec-dev/dsec/internal/vminit"
)

// Set by the build (-ldflags "-X main.version=…").
var version = "dev"

func main() {
	if isVMInit() { // PID 1 of a microVM's initramfs
		os.Exit(vminitMain())
	}
	if len(os.Args) == 5 && os.Args[1] == vminit.AgentArg && os.Getppid() == 1 { // hidden: a VM guest's init only
		os.Exit(vmAgentMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "serve" { // hidden: tests and benchmarks
		os.Exit(serve(os.Args[2:], os.Stderr))
	}
	if len(os.Args) == 2 && os.Args[1] == "sandbox" { // hidden: the container runtime only
		os.Exit(sandboxMain(os.Stderr))
	}
	if len(os.Args) == 2 && os.Args[1] == "zygote" { // hidden: the container runtime only
		os.Exit(guest.Zygote(os.NewFile(3, "zygote-conn")))
	}
	os.Exit(guest.Main(context.Background(), version, os.Args[1:], os.Stdout, os.Stderr))
}
