package sandbox

// Ended is how a sandbox ended by itself, with no Destroy asked: its
// agent (a container's PID 1) died, or its VM's guest panicked, powered
// off or rebooted, or its VMM exited. Such a sandbox can serve nothing
// more; its record becomes failed with Reason.
type Ended struct {
	ID string
	// Code says what ended it (EndAgentExited…), Detail how, in words
	// (an exit status, a signal, the guest's panic message).
	Code, Detail string
	// Pid is the host pid of the process that ended (the agent, QEMU);
	// Status its wait status, or -1 where the kernel could not tell.
	Pid    int
	Status int
}

// Reason is the failed record's reason: "code: detail".
func (e Ended) Reason() string {
	if e.Detail == "" {
		return e.Code
	}
	return e.Code + ": " + e.Detail
}

// Codes of Ended, stable: they start the failed record's reason.
const (
	// EndAgentExited: a container sandbox's agent, its PID 1, is gone
	// (killed or exited), and with it every process of the sandbox.
	EndAgentExited = "agent_exited"
	// EndGuestPanicked: the VM's guest kernel panicked.
	EndGuestPanicked = "guest_panicked"
	// EndGuestPoweredOff: the VM's guest powered off.
	EndGuestPoweredOff = "guest_powered_off"
	// EndGuestRebooted: the VM's guest rebooted (QEMU runs -no-reboot:
	// a reboot ends the VM).
	EndGuestRebooted = "guest_rebooted"
	// EndVMMExited: the VM's QEMU process ended on its own (crashed or
	// was killed) without its guest asking.
	EndVMMExited = "vmm_exited"
	// EndNodeShutdown: the sandbox's node stopped and destroyed it (a
	// node that leaves without keeping its sandboxes).
	EndNodeShutdown = "node_shutdown"
)

// EndNotifier is a Runtime that notices when its sandboxes end by
// themselves (Ended), within about a second, and then releases
// everything the sandbox held, as Destroy does.
type EndNotifier interface {
	// OnEnd sets fn, which the runtime calls once for every sandbox that
	// ended by itself, after releasing it, from a goroutine of its own.
	// It is set before Recover and Create; nil stops the calls. It may
	// come for a sandbox whose Create has not returned yet.
	OnEnd(fn func(Ended))
}
