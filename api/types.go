// Package api holds the wire types of DSec's REST API v1 and the OpenAPI
// document that describes them. It is public so that Go programs can use the
// same types as the server; the client package builds on it.
package api

import "time"

// Version is the API version served under /v1.
const Version = "v1"

// Tiers.
const (
	TierFunction  = "function"
	TierContainer = "container"
	TierMicroVM   = "microvm"
	TierVM        = "vm"
)

// Tiers lists every tier DSec defines, in order of isolation strength.
var Tiers = []string{TierFunction, TierContainer, TierMicroVM, TierVM}

// State is a sandbox lifecycle state.
type State string

// The lifecycle: pending → running → stopping → stopped; any non-final state
// may also become failed.
const (
	StatePending  State = "pending"
	StateRunning  State = "running"
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
	StateFailed   State = "failed"
)

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	// Tier selects the isolation substrate; it is the one parameter that
	// switches between WebAssembly, containers and VMs. Default "function".
	Tier string `json:"tier,omitempty"`
	// Image is an image name[:tag] or ID. Default: the tier's default image.
	Image string `json:"image,omitempty"`
	// CPU in cores (may be fractional). Default 1.
	CPU float64 `json:"cpu,omitempty"`
	// MemoryMB caps the sandbox's memory. Default 256.
	MemoryMB int `json:"memory_mb,omitempty"`
	// DiskMB caps the sandbox's writable storage. Default 256.
	DiskMB int `json:"disk_mb,omitempty"`
	// TimeoutS is the time to live in seconds; the sandbox is destroyed
	// when it runs out. Default 300.
	TimeoutS int `json:"timeout_s,omitempty"`
	// Env is set for every command run in the sandbox.
	Env map[string]string `json:"env,omitempty"`
	// Labels are free key/value pairs that list can filter on.
	Labels map[string]string `json:"labels,omitempty"`
	// Layers names the image's layers inline instead of Image: bottom
	// first, each by name:version or ID.
	Layers []ImageLayer `json:"layers,omitempty"`
	// Network is what the sandbox may reach (container and VM tiers; the
	// function tier has no network). Default: nothing at all. With Phases,
	// each phase has its own instead.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Phases are the task's phases, in order, each with its own
	// permissions; the sandbox starts in the first. Only the API caller
	// changes phase (SetPhaseRequest), forward unless told otherwise.
	Phases []Phase `json:"phases,omitempty"`
	// Capabilities are the Linux capabilities commands run with (container
	// tier), as "CAP_NET_BIND_SERVICE" or "net_bind_service", among the
	// grantable ones (chown, dac_override, fowner, fsetid, kill, setgid,
	// setuid, net_bind_service, ipc_owner, sys_chroot), and the most any
	// phase may grant. Default: none; with phases, the union of theirs
	// (each phase's commands get the phase's own).
	Capabilities []string `json:"capabilities,omitempty"`
	// Trajectory names the durable log the sandbox records to (letters,
	// digits and "-_./:", at most 200 bytes); Record asks for one with a
	// generated name. See docs/design/trajectories.md.
	Trajectory string `json:"trajectory,omitempty"`
	Record     bool   `json:"record,omitempty"`
	// SecretEnv names Env keys whose values are never logged; a resume
	// asks for them again.
	SecretEnv []string `json:"secret_env,omitempty"`
	// ResumeOnPreempt: when the sandbox's node is lost, drained or
	// reclaimed, the control plane resumes it elsewhere from its
	// trajectory, behind the same ID.
	ResumeOnPreempt bool `json:"resume_on_preempt,omitempty"`
	// FromSnapshot starts the sandbox from a snapshot's state (its ID),
	// instead of Image or Layers.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// RequestID makes the create idempotent (the HTTP header
	// Idempotency-Key sets it too): the same owner's create with the same
	// RequestID within a day gets the sandbox the first one made (waiting
	// for it if it is being made) instead of another. The same RequestID
	// with a different request is refused (request_id_reused). 1–128
	// letters, digits and "-_.:/".
	RequestID string `json:"request_id,omitempty"`
}

// IdempotencyKeyHeader carries a create's RequestID.
const IdempotencyKeyHeader = "Idempotency-Key"

// Phase is one stage of a task and what commands may do in it. A change
// of phase ends every process of the earlier one (the sandbox's agent
// aside): nothing a phase started keeps a privilege into the next.
type Phase struct {
	// Name is 1–32 letters, digits, '_' or '-', unique in the task.
	Name string `json:"name"`
	// Network is what the sandbox may reach in this phase (default:
	// nothing).
	Network *NetworkPolicy `json:"network,omitempty"`
	// Writable are the absolute paths that may be written in this phase;
	// the rest of the root is read-only. Omitted: the whole root is
	// writable; empty: nothing is.
	Writable []string `json:"writable"`
	// User runs this phase's commands: "root" (the default) or a numeric
	// "uid" or "uid:gid" of the sandbox.
	User string `json:"user,omitempty"`
	// CPU and MemoryMB, if set, replace the sandbox's limits during the
	// phase (the microvm tier, whose VM's are fixed at boot, refuses
	// other values than the sandbox's: phase_limits_unsupported).
	CPU      float64 `json:"cpu,omitempty"`
	MemoryMB int     `json:"memory_mb,omitempty"`
	// Capabilities are this phase's commands' capabilities, whatever
	// their user (container and microvm tiers; on microvm the guest
	// enforces them), among the sandbox's (see
	// CreateSandboxRequest.Capabilities). Default: none.
	Capabilities []string `json:"capabilities,omitempty"`
	// Executables, if set, are the only programs that may run in this
	// phase: absolute paths of files, of directories followed by "/*"
	// (every file directly in one), or of directories followed by "/**"
	// (every file below one, at any depth). The file the kernel executes counts
	// (a symlink's target, a script's interpreter), wherever it was
	// called from; any other exec is killed before it runs and audited
	// (rule exec-not-allowed). On the function tier they name the
	// /bin/<name>.wasm modules a call may run. Where they cannot be
	// enforced (microvm: the node's monitor does not see inside a
	// guest) they are refused (executables_unenforced). Omitted: any
	// program.
	Executables []string `json:"executables,omitempty"`
}

// AuditEvent is one thing a process in a sandbox did that the node's
// monitor saw (an exec, or a watched system call and its result), and the
// rule it hit, if any.
type AuditEvent struct {
	Sandbox string `json:"sandbox"`
	Phase   string `json:"phase,omitempty"`
	// Step is the trajectory step current at the event's time (0: none,
	// or a sandbox without a trajectory).
	Step int       `json:"step,omitempty"`
	Time time.Time `json:"time"`
	// Pid is the process's host pid; UID its host uid; Comm its name.
	Pid  uint32 `json:"pid"`
	UID  uint32 `json:"uid"`
	Comm string `json:"comm"`
	// Kind is "exec" or "syscall" (the kernel's monitor), "oom-kill", or
	// an event the node reports itself (internal/monitor's Kind…).
	Kind    string `json:"kind"`
	Syscall string `json:"syscall,omitempty"`
	// Path is the program executed or the call's path argument (made
	// absolute in the sandbox's root where the monitor saw it); Target
	// the new name of a rename or link; Addr a connect's destination.
	Path   string `json:"path,omitempty"`
	Target string `json:"target,omitempty"`
	Addr   string `json:"addr,omitempty"`
	// Argv is an exec's arguments (their first 255 bytes).
	Argv []string `json:"argv,omitempty"`
	// Result is what the call returned (a negative errno when refused).
	Result int64 `json:"result"`
	// Verdict is "allowed", "denied" (EPERM or EACCES: a security check
	// refused it) or "failed" (any other error).
	Verdict string `json:"verdict"`
	// Severity is "info" without a rule, else the rule's: "low",
	// "medium", "high" or "critical".
	Severity    string `json:"severity"`
	Rule        string `json:"rule,omitempty"`
	Description string `json:"description,omitempty"`
	// Detail says what the node saw, for events it reports itself (a
	// sandbox-ended event's failure reason).
	Detail string `json:"detail,omitempty"`
}

// AuditEventList is GET /v1/sandboxes/{id}/events.
type AuditEventList struct {
	Events []AuditEvent `json:"events"`
}

// PhaseChange is a sandbox entering a phase.
type PhaseChange struct {
	Phase string    `json:"phase"`
	At    time.Time `json:"at"`
}

// RuleCount is how often a sandbox hit an audit rule.
type RuleCount struct {
	Rule     string    `json:"rule"`
	Severity string    `json:"severity"`
	Count    int       `json:"count"`
	First    time.Time `json:"first"`
}

// IntegrityReport is GET /v1/sandboxes/{id}/integrity: what a trainer
// needs to decide whether to trust (or zero) a rollout's reward.
type IntegrityReport struct {
	Sandbox string `json:"sandbox"`
	// Phases are the phases the sandbox went through, in order.
	Phases []PhaseChange `json:"phases"`
	// Events counts the monitor's events; Denied those refused by a
	// security check (blocked actions).
	Events int `json:"events"`
	Denied int `json:"denied"`
	// Rules are the audit rules hit, and BySeverity their hits by
	// severity (low, medium, high, critical).
	Rules      []RuleCount    `json:"rules"`
	BySeverity map[string]int `json:"by_severity"`
	// SealedGrading says whether a sealed grading ran (POST …/grade);
	// Grades are the gradings, oldest first.
	SealedGrading bool           `json:"sealed_grading"`
	Grades        []GradeSummary `json:"grades"`
	// Suspicious: a rule of high or critical severity was hit.
	Suspicious bool `json:"suspicious"`
	// Monitored: the node's monitor watched the sandbox (false where it
	// could not run, and on tiers whose commands run on a guest kernel
	// (microvm), which the node's monitor does not see: then nothing
	// above comes from it).
	Monitored bool `json:"monitored"`
	// GuestEnforced names the parts of the sandbox's phases its guest
	// applies itself rather than the host: "writable" (read-only root
	// and writable paths), "user", "capabilities", "processes" (killing
	// the earlier phase's processes). A VM tier's guest runs only the
	// task's code and sits inside the trust boundary, the VM being the
	// isolation; code running as root with capabilities in the guest
	// could undo these parts for itself. Empty where the host applies
	// every part (container, function). A phase's network is always
	// enforced by the host.
	GuestEnforced []string `json:"guest_enforced"`
}

// SetPhaseRequest moves a sandbox to another of its phases.
type SetPhaseRequest struct {
	Phase string `json:"phase"`
	// Back allows moving to an earlier phase (refused otherwise).
	Back bool `json:"back,omitempty"`
}

// Egress modes of a NetworkPolicy.
const (
	EgressNone      = "none"
	EgressAllowlist = "allowlist"
	EgressOpen      = "open"
)

// NetworkPolicy is a sandbox's network policy. Whatever it says, a
// sandbox never reaches the node, the control plane, other sandboxes or
// link-local and metadata addresses; private and CGNAT ranges only when
// an Allow rule names them.
type NetworkPolicy struct {
	// Egress is "none" (the default), "allowlist" (only Allow) or "open"
	// (the public internet, plus Allow).
	Egress string `json:"egress,omitempty"`
	// Allow lists destinations.
	Allow []NetworkRule `json:"allow,omitempty"`
}

// NetworkRule allows one destination: a CIDR or a DNS name (resolved by
// the node when the policy is set), optionally one protocol and ports.
type NetworkRule struct {
	CIDR string `json:"cidr,omitempty"`
	Host string `json:"host,omitempty"`
	// Proto is "tcp" or "udp"; empty means any protocol.
	Proto string `json:"proto,omitempty"`
	// Ports is "443" or "8000-8100"; empty means all. It needs Proto.
	Ports string `json:"ports,omitempty"`
}

// Sandbox describes a sandbox.
type Sandbox struct {
	ID       string            `json:"id"`
	Tier     string            `json:"tier"`
	Image    string            `json:"image"`
	ImageID  string            `json:"image_id,omitempty"`
	State    State             `json:"state"`
	Node     string            `json:"node,omitempty"`
	CPU      float64           `json:"cpu"`
	MemoryMB int               `json:"memory_mb"`
	DiskMB   int               `json:"disk_mb"`
	TimeoutS int               `json:"timeout_s"`
	Labels   map[string]string `json:"labels,omitempty"`
	Network  *NetworkPolicy    `json:"network,omitempty"`
	// Phases are the task's phases and Phase the current one ("" for a
	// sandbox without phases).
	Phases []Phase `json:"phases,omitempty"`
	Phase  string  `json:"phase,omitempty"`
	// Capabilities are the request's (CreateSandboxRequest.Capabilities).
	Capabilities []string   `json:"capabilities,omitempty"`
	CreatedAt    time.Time  `json:"created_at"`
	ExpiresAt    time.Time  `json:"expires_at"`
	EndedAt      *time.Time `json:"ended_at,omitempty"`
	// Trajectory is the log the sandbox records to; Incarnation counts
	// the sandboxes that have been this one (1, plus one per resume).
	Trajectory  string `json:"trajectory,omitempty"`
	Incarnation int    `json:"incarnation,omitempty"`
	// Divergence is set when a resume stopped at a step that did not
	// match the log (the sandbox is kept as it was at that step).
	Divergence *Divergence `json:"divergence,omitempty"`
	// Reason says why a sandbox stopped or failed (e.g. "expired", "deleted").
	Reason string `json:"reason,omitempty"`
}

// SandboxStats is a sandbox's resource use, as the node sees it from
// outside the sandbox (cgroups, its writable layer): nothing in it comes
// from code running in the sandbox. Limits that were hit show here:
// OOMKills > 0 (a process was killed for memory), DiskFull, PidsLimited.
type SandboxStats struct {
	MemoryBytes      int64   `json:"memory_bytes"`
	MemoryPeakBytes  int64   `json:"memory_peak_bytes,omitempty"`
	MemoryLimitBytes int64   `json:"memory_limit_bytes,omitempty"`
	CPUSeconds       float64 `json:"cpu_seconds"`
	Processes        int     `json:"processes"`
	DiskBytes        int64   `json:"disk_bytes"`
	DiskLimitBytes   int64   `json:"disk_limit_bytes,omitempty"`
	// DiskFull is set when the writable layer has no room left.
	DiskFull bool `json:"disk_full,omitempty"`
	// OOMKills counts processes the kernel killed at the memory limit.
	OOMKills int64 `json:"oom_kills,omitempty"`
	// PidsLimited counts forks refused at the process limit.
	PidsLimited int64 `json:"pids_limited,omitempty"`
	// HostMemoryBytes, on VM tiers, is the resident memory of the VM's
	// process on the host (what the guest touched plus the VMM's own);
	// MemoryBytes and MemoryLimitBytes are then the guest's own view
	// (used and total memory), CPUSeconds the host's (the VM process's
	// CPU time).
	HostMemoryBytes int64 `json:"host_memory_bytes,omitempty"`
}

// SandboxList is a page of sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
	// NextPageToken, if set, fetches the next page.
	NextPageToken string `json:"next_page_token,omitempty"`
}

// SetTimeoutRequest is the body of POST /v1/sandboxes/{id}/timeout. The
// sandbox then expires TimeoutS seconds from now.
type SetTimeoutRequest struct {
	TimeoutS int `json:"timeout_s"`
}

// ExecRequest runs a command. Exactly one of Cmd and Command is set.
type ExecRequest struct {
	// Cmd is the argv to run.
	Cmd []string `json:"cmd,omitempty"`
	// Command is a command line. Tiers with a shell run it with /bin/sh -c;
	// tiers without one split it into words (quotes are honoured, shell
	// operators are refused).
	Command string            `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// Cwd is the working directory: absolute, or relative to /workspace,
	// the default on every tier (where the files API's relative paths
	// lead too). It must exist.
	Cwd string `json:"cwd,omitempty"`
	// Stdin is written to the command's standard input, then closed.
	Stdin string `json:"stdin,omitempty"`
	// TimeoutS bounds the command's run time in seconds. Default 60.
	TimeoutS float64 `json:"timeout_s,omitempty"`
	// MaxOutputBytes caps each of stdout and stderr (default and maximum
	// are server settings, 4 MiB by default); the rest is dropped and the
	// result is marked truncated.
	MaxOutputBytes int `json:"max_output_bytes,omitempty"`
}

// ExecResult is the outcome of a command.
type ExecResult struct {
	// ExitCode is the command's exit status, or -1 if it had none (it was
	// killed, timed out or trapped; Error says which).
	ExitCode        int     `json:"exit_code"`
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	StdoutTruncated bool    `json:"stdout_truncated,omitempty"`
	StderrTruncated bool    `json:"stderr_truncated,omitempty"`
	DurationMS      float64 `json:"duration_ms"`
	TimedOut        bool    `json:"timed_out,omitempty"`
	// Error describes an abnormal end: "timeout", "killed", a wasm trap, …
	Error string `json:"error,omitempty"`
	// Phase is the sandbox's phase the command ran in ("" without phases).
	Phase string `json:"phase,omitempty"`
}

// Exec stream event types.
const (
	EventStart  = "start"
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	EventError  = "error"
)

// ExecEvent is one line of a streamed command (NDJSON or a WebSocket
// message). A stream is a start event, any number of stdout and stderr
// events, and one exit or error event.
type ExecEvent struct {
	Type string `json:"type"`
	// Data is a chunk of output for stdout and stderr events.
	Data string `json:"data,omitempty"`
	// Pid is set on start events for tiers with processes.
	Pid int `json:"pid,omitempty"`
	// Result is set on exit events; its Stdout and Stderr are empty since
	// the output was streamed.
	Result *ExecResult `json:"result,omitempty"`
	// Error is set on error events.
	Error *Error `json:"error,omitempty"`
}

// Process states.
const (
	ProcessRunning = "running"
	ProcessExited  = "exited"
)

// Process describes a background process.
type Process struct {
	Pid       int       `json:"pid"`
	Cmd       []string  `json:"cmd"`
	State     string    `json:"state"`
	ExitCode  *int      `json:"exit_code,omitempty"`
	StartedAt time.Time `json:"started_at"`
}

// ProcessList is the body of GET /v1/sandboxes/{id}/processes.
type ProcessList struct {
	Processes []Process `json:"processes"`
}

// StdinRequest sends data to a background process's standard input.
type StdinRequest struct {
	Data string `json:"data"`
}

// SignalRequest is the body of POST …/processes/{pid}/kill. Signal is a
// name such as "KILL" or "TERM"; default "KILL".
type SignalRequest struct {
	Signal string `json:"signal,omitempty"`
}

// File types.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

// FileInfo describes a file in a sandbox.
type FileInfo struct {
	Name string `json:"name"`
	// Path is absolute within the sandbox.
	Path string `json:"path"`
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode holds the permission bits.
	Mode    uint32    `json:"mode"`
	ModTime time.Time `json:"mtime"`
	// Target is a symlink's target.
	Target string `json:"target,omitempty"`
}

// FileList is the body of GET …/files/list.
type FileList struct {
	Entries []FileInfo `json:"entries"`
}

// ExistsResponse is the body of GET …/files/exists.
type ExistsResponse struct {
	Exists bool `json:"exists"`
}

// MkdirRequest is the body of POST …/files/mkdir.
type MkdirRequest struct {
	Path    string `json:"path"`
	Parents bool   `json:"parents,omitempty"`
}

// RenameRequest is the body of POST …/files/rename.
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Error is the body of every error response.
type Error struct {
	// Code is stable and names the condition: one of ErrorCodes, e.g.
	// CodeSandboxNotFound, or the class's name when none is more precise.
	Code    string `json:"code"`
	Message string `json:"message"`
	// Class is the error class (Class…), which determines the HTTP
	// status.
	Class string `json:"class,omitempty"`
}

// Health is the body of GET /v1/health.
type Health struct {
	Status string `json:"status"`
	Nodes  int    `json:"nodes"`
}

// VersionInfo is the body of GET /v1/version.
type VersionInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit,omitempty"`
	GoVersion string `json:"go_version"`
	API       string `json:"api"`
}

// TierInfo says whether and how a node runs a tier.
type TierInfo struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	// Reason says why an unavailable tier is unavailable.
	Reason string `json:"reason,omitempty"`
	// Accelerator is "kvm", "tcg" or "none" (no hardware virtualisation
	// involved, as for function and container).
	Accelerator string `json:"accelerator,omitempty"`
	// GuestKernel: the tier's commands run on a guest kernel, which the
	// node's monitor does not see (IntegrityReport.Monitored is false).
	GuestKernel bool `json:"guest_kernel,omitempty"`
	// GuestEnforced are the parts of a phase the tier's guest applies
	// (see IntegrityReport.GuestEnforced).
	GuestEnforced []string `json:"guest_enforced,omitempty"`
}

// Capacity is what a node offers.
type Capacity struct {
	CPUs         int `json:"cpus"`
	MemoryMB     int `json:"memory_mb"`
	MaxSandboxes int `json:"max_sandboxes"`
}

// Usage is what a node is using.
type Usage struct {
	Sandboxes int     `json:"sandboxes"`
	Load1     float64 `json:"load1"`
	MemoryMB  int     `json:"memory_used_mb"`
}

// Node describes a node service.
type Node struct {
	ID       string     `json:"id"`
	Version  string     `json:"version"`
	Tiers    []TierInfo `json:"tiers"`
	Capacity Capacity   `json:"capacity"`
	Usage    Usage      `json:"usage"`
	Ready    bool       `json:"ready"`
	LastSeen time.Time  `json:"last_seen"`
	// StartedAt is when the node's process started: a node that restarted
	// between two heartbeats is reconciled as one that came back.
	StartedAt time.Time `json:"started_at,omitzero"`
	// Monitor is the node's eBPF monitor of sandboxes: "on", "off", or
	// "unavailable: <why>" (sandboxes then run unmonitored, under the
	// same host-side rules).
	Monitor string `json:"monitor,omitempty"`
	// Guard is the node's cgroup-bpf guard (metadata addresses and raw
	// sockets refused in every sandbox's cgroup): "on" or "unavailable:
	// <why>".
	Guard string `json:"guard,omitempty"`
	// Cordoned: no new sandbox is placed on the node (its running ones
	// go on). Draining: cordoned, and its sandboxes are moving off: those
	// recorded with resume_on_preempt are resumed elsewhere, the others
	// run until they end or DrainDeadline, when they are destroyed.
	Cordoned      bool       `json:"cordoned,omitempty"`
	Draining      bool       `json:"draining,omitempty"`
	DrainDeadline *time.Time `json:"drain_deadline,omitempty"`
}

// DrainRequest is the body of POST /v1/nodes/{id}/drain.
type DrainRequest struct {
	// DeadlineS is how long the node's sandboxes that cannot be resumed
	// elsewhere may run on before they are destroyed (default 3600).
	DeadlineS int `json:"deadline_s,omitempty"`
}

// NodeList is the body of GET /v1/nodes.
type NodeList struct {
	Nodes []Node `json:"nodes"`
}

// Image describes an image a sandbox can start from: an ordered list of
// layers (bottom first), or a directory on the server for development
// images.
type Image struct {
	ID string `json:"id"`
	// Name is the name:tag this entry was listed or resolved under.
	Name   string       `json:"name,omitempty"`
	Layers []ImageLayer `json:"layers,omitempty"`
	// Tiers the image is meant for (empty: any).
	Tiers []string `json:"tiers,omitempty"`
	// Source is "layers", or "dir:<path>" for a directory image.
	Source    string    `json:"source"`
	CreatedAt time.Time `json:"created_at"`
}

// ImageList is the body of GET /v1/images.
type ImageList struct {
	Images []Image `json:"images"`
}

// AddDirImageRequest registers a directory on the server host as an image
// (POST /v1/images/dir). It is an operator convenience until layer images
// exist: the server reads the directory read-only and never writes to it.
type AddDirImageRequest struct {
	Name  string   `json:"name"`
	Path  string   `json:"path"`
	Tiers []string `json:"tiers,omitempty"`
}

// ImageLayer is one layer of an image.
type ImageLayer struct {
	Role string `json:"role"`
	ID   string `json:"id"`
}

// Layer describes a layer: an EROFS metadata image and data blob.
type Layer struct {
	ID string `json:"id"`
	// Names are the name:version references that point at it.
	Names      []string  `json:"names,omitempty"`
	MetaSize   int64     `json:"meta_size"`
	BlobSize   int64     `json:"blob_size"`
	SourceKind string    `json:"source_kind"`
	Source     string    `json:"source_digest"`
	Builder    string    `json:"builder"`
	CreatedAt  time.Time `json:"created_at"`
}

// LayerList is the body of GET /v1/layers.
type LayerList struct {
	Layers []Layer `json:"layers"`
}

// CreateImageRequest composes an image from layers (POST /v1/images).
// Layers are given bottom first, each by name:version or ID, with a role;
// Base, Workspace and Toolkit are a shorthand for the usual three.
type CreateImageRequest struct {
	Name      string       `json:"name"`
	Layers    []ImageLayer `json:"layers,omitempty"`
	Base      string       `json:"base,omitempty"`
	Workspace string       `json:"workspace,omitempty"`
	Toolkit   string       `json:"toolkit,omitempty"`
	Tiers     []string     `json:"tiers,omitempty"`
}

// TagRequest points a name:tag at an image (POST /v1/images/tag).
type TagRequest struct {
	Image string `json:"image"`
	Name  string `json:"name"`
}

// BuildDirLayerRequest builds a layer from a directory on the server
// (POST /v1/layers/dir; an operator convenience like directory images).
type BuildDirLayerRequest struct {
	Path string `json:"path"`
	Name string `json:"name,omitempty"`
}
