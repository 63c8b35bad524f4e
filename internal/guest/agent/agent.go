// Package agent is the server side of dsec-guest, the agent inside a
// container sandbox: it serves the agentproto protocol on a listener the
// sandbox setup created, runs commands (buffered, streamed, in the
// background, on a PTY), serves the files API confined to the sandbox
// root, and, as PID 1, reaps every process of the sandbox.
//
// The agent runs among the code it serves. In a container the node treats
// it as compromised (everything is enforced from the host), and the agent
// in turn refuses connections from processes inside the sandbox, keeps its
// own environment and descriptors out of the commands it runs, and
// ignores the signals a sandbox process may send to PID 1. In a microVM
// guest, which is inside the trust boundary, it also applies phases'
// in-guest parts (Options.Phases, phase_linux.go).
package agent

import (
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Defaults of Options.
const (
	DefaultMaxOutput = 4 << 20
	DefaultPath      = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Options configure Run. The zero value of every field but Listener is a
// valid default.
type Options struct {
	// Listener yields the node's connections: a Unix socket in a
	// directory only the host can reach. Run owns it and closes it.
	Listener net.Listener
	// Logger receives the agent's own diagnostics; nil discards them.
	Logger *slog.Logger
	// Version is reported in Hello.
	Version string
	// MaxOutput is the output cap of a request that sets none (4 MiB).
	MaxOutput int
	// DefaultEnv is the environment of every command (NAME=value), under
	// the request's own; nil means just DefaultPath. The agent's own
	// environment never reaches commands.
	DefaultEnv []string
	// Workdir is the working directory of commands that name none, and
	// the one a relative cwd is taken relative to: default sandbox.Workdir
	// if it exists (every tier makes it), else / (dsec-guest serve on a
	// development host).
	Workdir string
	// Root is the directory the files API is confined to, shown to the
	// node as "/": default "/". Relative paths resolve against
	// sandbox.Workdir in it, the node's view of Workdir. Tests point it at
	// a temporary directory, and Workdir at its workspace.
	Root string
	// Subreaper makes the agent a child subreaper that reaps every
	// orphan, as PID 1 does, and shields it from signals, as PID 1 is.
	// It is implied when the agent is PID 1; `dsec-guest serve` sets it.
	Subreaper bool
	// PeerCheck decides whether a connection's peer may use the agent.
	// nil means RequireOutsidePIDNamespace. Tests that run the agent in
	// their own pid namespace replace it.
	PeerCheck func(Peer) error
	// Fork, if set, runs every fork of a command (the function it is
	// given) and returns its result. The sandbox setup uses it to fork
	// from the one OS thread whose capability bounding set it emptied:
	// the bounding set is per thread and commands inherit the forking
	// thread's. nil forks on whatever thread the call runs on.
	Fork func(fork func() (int, error)) (int, error)
	// Phases makes the agent apply phases' in-sandbox parts itself
	// (agentproto.OpPhase, announced as CapPhase): kill every other
	// process, make the root read-only but for the writable paths. Only
	// a microVM guest's agent sets it: it owns the whole guest, and the
	// guest is inside the trust boundary. A container's agent leaves it
	// unset and refuses the operation (its host applies phases).
	Phases bool
	// CommandCgroup, if set, is a cgroup2 directory every command starts
	// in (clone3 CLONE_INTO_CGROUP), the agent staying out of it. A
	// microVM guest's init makes one whose pids and memory limits leave
	// the agent room: a fork bomb or a memory hog in the guest cannot
	// starve the agent of threads or memory.
	CommandCgroup string
	// Upper, if set, is the guest's writable layer: the overlay's upper
	// directory, on a file system of its own (the VM's upper disk). The
	// agent then serves the state operations snapshots use (announced
	// as agentproto.CapState): it freezes and thaws that file system and
	// lists and streams the directory. Only a microVM guest's init sets
	// it (it mounted the upper and keeps its descriptor across the
	// switch into the guest's root). Run owns it.
	Upper *os.File
}

// Peer is a connection's peer as SO_PEERCRED reports it, translated into
// the agent's namespaces.
type Peer = sys.Ucred

// PeerConn is a connection that knows its peer without SO_PEERCRED. A
// microVM guest's agent serves the host over a virtio-serial port, a byte
// stream rather than a socket, whose only possible peer is the host (the
// node service, outside the guest): its connections report Peer{} (pid 0).
type PeerConn interface {
	net.Conn
	PeerCred() (Peer, error)
}

// RequireOutsidePIDNamespace is the default peer check: it accepts only
// peers whose process has no pid in the agent's pid namespace (the kernel
// reports pid 0 for them), that is the node service in an ancestor
// namespace. Every process of the sandbox lives in the agent's namespace
// and has a pid there, so one that reaches the socket somehow is refused.
// It relies on the agent being PID 1 of the sandbox's own pid namespace.
func RequireOutsidePIDNamespace(p Peer) error {
	if p.Pid != 0 {
		return errdefs.New(errdefs.PermissionDenied, api.CodePeerInSandbox,
			"refusing a connection from pid %d inside the sandbox (uid %d)", p.Pid, p.Uid)
	}
	return nil
}

func (o *Options) withDefaults() error {
	if o.Listener == nil {
		return fmt.Errorf("agent: %w", errdefs.New(errdefs.Invalid, api.CodeNoListener, "no listener given"))
	}
	if o.MaxOutput <= 0 {
		o.MaxOutput = DefaultMaxOutput
	}
	if o.DefaultEnv == nil {
		o.DefaultEnv = []string{DefaultPath}
	}
	if o.Root == "" {
		o.Root = "/"
	}
	if o.PeerCheck == nil {
		o.PeerCheck = RequireOutsidePIDNamespace
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}
