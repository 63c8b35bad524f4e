package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/dsec-dev/dsec/internal/guest/vminit"
)

// isVMInit reports whether this process is the init of a microVM guest:
// PID 1 started as /init (the initramfs internal/vm/vmkernel builds).
// Container sandboxes run the agent as /opt/dsec/bin/dsec-guest.
func isVMInit() bool {
	return os.Getpid() == 1 && len(os.Args) > 0 && filepath.Base(os.Args[0]) == "init"
}

// vminitMain runs the VM guest's init; it returns only if that refuses.
func vminitMain() int {
	err := vminit.Run(version)
	fmt.Fprintln(os.Stderr, "dsec-guest:", err)
	return 1
}

// vmAgentMain is the agent beside the image's init system in a VM guest
// (vminit.AgentMain).
func vmAgentMain(args []string) int {
	err := vminit.AgentMain(args)
	fmt.Fprintln(os.Stderr, "dsec-guest:", err)
	return 1
}
