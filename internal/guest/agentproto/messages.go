package agentproto

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Operations, the Op of a Request.
const (
	OpHello      = "hello"
	OpExec       = "exec"   // ExecArgs; Event Started; Data out/err; Reply api.ExecResult (or api.Process when Background)
	OpWait       = "wait"   // PidArgs; Data out/err (the collected output); Reply api.ExecResult
	OpAttach     = "attach" // PidArgs; Data out/err from now on; Reply api.ExecResult
	OpStdin      = "stdin"  // PidArgs; Data in until EOF; Reply {}
	OpCloseStdin = "close_stdin"
	OpSignal     = "signal"    // SignalArgs
	OpResize     = "resize"    // ResizeArgs
	OpProcesses  = "processes" // Data out: JSON arrays of api.Process; Reply {}
	OpProcess    = "process"   // PidArgs; Reply api.Process
	OpOpen       = "open"      // PathArgs; Event api.FileInfo; Data out; Reply {}
	OpWrite      = "write"     // WriteArgs; Data in until EOF; Reply api.FileInfo
	OpList       = "list"      // ListArgs; Data out: JSON arrays of api.FileInfo; Reply {}
	OpStat       = "stat"      // PathArgs; Reply api.FileInfo
	OpMkdir      = "mkdir"     // MkdirArgs; Reply api.FileInfo
	OpRemove     = "remove"    // RemoveArgs; Reply {}
	OpRename     = "rename"    // RenameArgs; Reply api.FileInfo
	OpStats      = "stats"     // Reply AgentStats
	OpPhase      = "phase"     // PhaseArgs; Reply PhaseResult (CapPhase agents only)
	// The writable state, for snapshots (CapState agents only).
	OpFreeze    = "freeze"     // FreezeArgs; Reply {}
	OpThaw      = "thaw"       // Reply {}
	OpStateList = "state_list" // Data out: NDJSON StateEntry, parents first; Reply {}
	OpStateRead = "state_read" // StateReadArgs; Data out: the file's content; Reply {}
)

// Capabilities an agent may announce in Hello.
const (
	CapExec      = "exec"
	CapProcesses = "processes"
	CapPTY       = "pty"
	CapAttach    = "attach"
	CapFiles     = "files"
	CapStats     = "stats"
	// CapPhase: the agent applies a phase's in-sandbox parts itself
	// (OpPhase). Only a microVM guest's agent, which owns the whole
	// guest, announces it; a container's agent refuses the operation
	// (there the host applies phases).
	CapPhase = "phase"
	// CapState: the agent reaches the guest's writable layer (the
	// overlay's upper directory on its own disk) and serves OpFreeze,
	// OpThaw, OpStateList and OpStateRead, for snapshots. Only a
	// microVM guest's agent whose init handed it the upper announces
	// it.
	CapState = "state"
)

// MaxFreeze is the longest the agent keeps the writable layer's file
// system frozen: past it the agent thaws it by itself, and the next
// OpThaw fails with api.CodeStateFreezeExpired (what was read meanwhile
// may be torn). A node that crashed mid-snapshot thus stalls its guest's
// writes for MaxFreeze at most.
const MaxFreeze = 2 * time.Minute

// MaxStateEntries bounds the entries of a state listing; the agent fails
// a longer one, the node refuses more.
const MaxStateEntries = 1 << 20

// StateEntry is one entry of a state listing (sandbox.StateEntry).
type StateEntry = sandbox.StateEntry

// MaxListEntries bounds the entries of a List or Processes reply; the
// agent fails a listing that would be longer, the node refuses more.
const MaxListEntries = 1 << 16

// Request is the payload of an Open frame.
type Request struct {
	Op   string          `json:"op"`
	Args json.RawMessage `json:"args,omitempty"`
}

// Reply is the payload of a Reply frame: an error or a result.
type Reply struct {
	Error  *WireError      `json:"error,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
}

// WireError is an errdefs.Error on the wire.
type WireError struct {
	Class   string `json:"class"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// EncodeError turns err into its wire form: class, code and the
// user-facing message (causes stay with the agent).
func EncodeError(err error) *WireError {
	msg := errdefs.MessageOf(err)
	var e *errdefs.Error
	if !errors.As(err, &e) && errdefs.ClassOf(err) == errdefs.Internal {
		msg = err.Error() // the agent's internals are the sandbox's, not the node's
	}
	return &WireError{Class: string(errdefs.ClassOf(err)), Code: errdefs.CodeOf(err), Message: msg}
}

// Err rebuilds the classified error. Unknown classes become Internal; the
// code and message are the agent's, so they are untrusted text.
func (w *WireError) Err() error {
	code := w.Code
	if code == "" {
		code = "agent_error"
	}
	return &errdefs.Error{Class: errdefs.ParseClass(w.Class), Code: code, Msg: w.Message}
}

// HelloArgs opens a connection.
type HelloArgs struct {
	Protocol int    `json:"protocol"`
	Client   string `json:"client,omitempty"`
}

// Hello is the agent's answer to HelloArgs.
type Hello struct {
	Protocol     int      `json:"protocol"`
	AgentVersion string   `json:"agent_version"`
	Pid          int      `json:"pid"`
	Capabilities []string `json:"capabilities"`
}

// User is the identity a command runs as. The zero value is uid 0, gid 0:
// the sandbox's root.
type User struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// Caps are the capability numbers the command runs with (ambient,
	// whatever its uid); none by default. The node's guarantee is the
	// sandbox's bounding set, fixed at its start: an agent that ignores
	// Caps cannot give a command more.
	Caps []uint `json:"caps,omitempty"`
}

// PTYSize is a terminal's size in character cells.
type PTYSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ExecArgs is the wire form of an ExecRequest.
type ExecArgs struct {
	Argv           []string          `json:"argv"`
	Env            map[string]string `json:"env,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	User           User              `json:"user"`
	Stdin          string            `json:"stdin,omitempty"`
	StdinStream    bool              `json:"stdin_stream,omitempty"`
	TimeoutS       float64           `json:"timeout_s,omitempty"`
	MaxOutputBytes int               `json:"max_output_bytes,omitempty"`
	PTY            *PTYSize          `json:"pty,omitempty"`
	// Background starts the command and replies at once with its
	// api.Process; its output is collected for Wait and Attach.
	Background bool `json:"background,omitempty"`
}

// Started is the Event of an exec call once the command runs.
type Started struct {
	Pid int `json:"pid"`
}

// PidArgs names a process.
type PidArgs struct {
	Pid int `json:"pid"`
}

// SignalArgs sends a signal by name (KILL, TERM, …).
type SignalArgs struct {
	Pid    int    `json:"pid"`
	Signal string `json:"signal"`
}

// ResizeArgs resizes a process's terminal.
type ResizeArgs struct {
	Pid  int    `json:"pid"`
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// PhaseArgs are the in-guest parts of a phase change (OpPhase): the
// agent kills every process but itself, then makes the root read-only
// but for Writable.
type PhaseArgs struct {
	// Writable are the absolute paths that stay writable, each a
	// writable bind mount of itself, resolved without following
	// symlinks; nil leaves the whole root writable, empty none of it.
	Writable []string `json:"writable"`
	// NoRoot makes the agent's later commands hold only the
	// capabilities each exec names (User.Caps), root's too
	// (SECBIT_NOROOT); it is never undone.
	NoRoot bool `json:"no_root,omitempty"`
}

// PhaseResult is the agent's answer to PhaseArgs.
type PhaseResult struct {
	// Killed counts the processes it killed.
	Killed int `json:"killed"`
}

// FreezeArgs freeze the writable layer's file system (OpFreeze) for at
// most TimeoutMS (MaxFreeze if 0 or longer).
type FreezeArgs struct {
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// StateReadArgs name a regular file of the writable layer (OpStateRead)
// by its path in a state listing.
type StateReadArgs struct {
	Path string `json:"path"`
}

// PathArgs names a file.
type PathArgs struct {
	Path string `json:"path"`
}

// WriteArgs starts a file upload.
type WriteArgs struct {
	Path     string `json:"path"`
	Mode     uint32 `json:"mode,omitempty"`
	Parents  bool   `json:"parents,omitempty"`
	MaxBytes int64  `json:"max_bytes,omitempty"`
}

// ListArgs lists a directory.
type ListArgs struct {
	Path  string `json:"path"`
	Depth int    `json:"depth"`
}

// MkdirArgs makes a directory.
type MkdirArgs struct {
	Path    string `json:"path"`
	Parents bool   `json:"parents,omitempty"`
}

// RemoveArgs removes a file or directory.
type RemoveArgs struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

// RenameArgs renames a file or directory.
type RenameArgs struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// AgentStats is what the agent reports about itself and its sandbox. It
// is informative only: the node never bases a decision on it.
type AgentStats struct {
	AgentVersion string  `json:"agent_version"`
	Pid          int     `json:"pid"`
	UptimeS      float64 `json:"uptime_s"`
	// Processes counts the processes the agent sees in /proc (the
	// sandbox's, in its pid namespace).
	Processes int `json:"processes"`
	// Tracked counts the commands the agent runs; Background those of
	// them that are background processes, running or kept after exit.
	Tracked     int `json:"tracked"`
	Background  int `json:"background"`
	Connections int `json:"connections"`
	// AgentRSSBytes is the agent's own resident memory.
	AgentRSSBytes int64 `json:"agent_rss_bytes"`
	// MemTotalBytes and MemAvailableBytes come from /proc/meminfo;
	// CgroupMemoryBytes from the cgroup's memory.current when readable.
	MemTotalBytes     int64   `json:"mem_total_bytes"`
	MemAvailableBytes int64   `json:"mem_available_bytes"`
	CgroupMemoryBytes int64   `json:"cgroup_memory_bytes,omitempty"`
	Load1             float64 `json:"load1"`
	Goroutines        int     `json:"goroutines"`
	// RootUsedBytes and RootSizeBytes are statfs of the agent's root
	// (an overlay's are its upper's); RootFull is set when it has no
	// room or no inode left.
	RootUsedBytes int64 `json:"root_used_bytes,omitempty"`
	RootSizeBytes int64 `json:"root_size_bytes,omitempty"`
	RootFull      bool  `json:"root_full,omitempty"`
}

// processPage and filePage are the JSON chunks of listings.
type (
	processPage = []api.Process
	filePage    = []api.FileInfo
)
