// Command dsec-guest is DSec's in-sandbox binary: PID 1 of a container
// sandbox (its setup, then the agent), the zygote that forks container
// sandboxes, and the init and agent of a VM guest; how it was started
// picks the mode. It is a small static binary, reached by containers
// through the read-only toolkit/dsec-guest layer
// (/opt/dsec/bin/dsec-guest) and by VMs as their initramfs's /init.
package main

import (
	"context"
	"os"

	"github.com/dsec-dev/dsec/internal/guest/setup"
	"github.com/dsec-dev/dsec/internal/guest/vminit"
)

// Set by the build (-ldflags "-X main.version=…").
var version = "dev"

func main() {
	if isVMInit() { // PID 1 of a microVM's initramfs
		os.Exit(vminitMain())
	}
	if (len(os.Args) == 5 || len(os.Args) == 6) && os.Args[1] == vminit.AgentArg && os.Getppid() == 1 { // hidden: a VM guest's init only
		os.Exit(vmAgentMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "serve" { // hidden: tests and benchmarks
		os.Exit(serve(os.Args[2:], os.Stderr))
	}
	if len(os.Args) == 2 && os.Args[1] == "sandbox" { // hidden: the container runtime only
		os.Exit(sandboxMain(os.Stderr))
	}
	if len(os.Args) == 2 && os.Args[1] == "zygote" { // hidden: the container runtime only
		os.Exit(setup.Zygote(os.NewFile(3, "zygote-conn")))
	}
	os.Exit(setup.Main(context.Background(), version, os.Args[1:], os.Stdout, os.Stderr))
}
