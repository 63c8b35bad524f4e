// Package sandbox defines the contract every tier runtime implements
// (function, container, microvm, vm), the registry that maps tier names to
// runtimes, the lifecycle state machine, and helpers all tiers share so that
// they behave alike (output capture, path rules, unsupported operations).
//
// The conformance suite in package sandboxtest checks a Runtime against this
// contract; every tier must pass it unchanged.
package sandbox

import (
	"context"
	"io"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
)

// Runtime runs sandboxes of one tier on one node.
// Implementations are safe for concurrent use.
type Runtime interface {
	// Tier is the tier's name, e.g. "function".
	Tier() string
	// Capabilities says which optional operations the tier supports.
	Capabilities() Capabilities
	// Fingerprint probes the host: whether the tier can run here and with
	// which accelerator.
	Fingerprint(ctx context.Context) api.TierInfo
	// Create builds and starts a sandbox. On error nothing of it is left.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
	// Recover re-adopts the sandboxes a previous run of this node left
	// running (after a restart of the node service), and removes any partial
	// ones. It is called once, before any Create.
	Recover(ctx context.Context) ([]Sandbox, error)
	// Close releases the runtime's own resources. Sandboxes are left as they
	// are; the node destroys them first if it should.
	Close(ctx context.Context) error
}

// Capabilities lists a tier's optional features.
type Capabilities struct {
	// Shell: Command strings run under /bin/sh -c. Without it they are split
	// into words and shell operators are refused.
	Shell bool `json:"shell"`
	// Processes: background processes with stdin and signals.
	Processes bool `json:"processes"`
	// PTY: interactive terminals.
	PTY bool `json:"pty"`
	// FileRoot is the directory the files API is confined to ("/" for a
	// whole-system tier, "/workspace" for function). It holds Workdir,
	// against which relative paths resolve on every tier.
	FileRoot string `json:"file_root"`
	// OwnRoot: the tier builds its sandboxes' roots from Image.Layers
	// itself; otherwise it reads the image at Image.Root.
	OwnRoot bool `json:"own_root"`
}

// Image is a resolved image on the node.
type Image struct {
	ID   string
	Name string
	// Root is the host path of the image's read-only tree (for tiers that
	// read the image in place).
	Root string
	// Layers are the image's layers, bottom first, for tiers that build
	// their own root from them (empty for a development directory image).
	Layers []layerspec.Layer
}

// Spec is everything a runtime needs to create a sandbox. Defaults have been
// applied and limits checked by the time a runtime sees it.
type Spec struct {
	ID       string
	Tier     string
	Image    Image
	CPU      float64
	MemoryMB int
	DiskMB   int
	Env      map[string]string
	// Network is the network policy (nil: no egress); tiers without a
	// network refuse any other. With Phases, each phase's replaces it.
	Network *api.NetworkPolicy
	// Phases are the task's phases (validated by the control plane); the
	// sandbox starts in the first.
	Phases []api.Phase
	// Capabilities are the commands' capabilities without phases, and the
	// most any phase grants (nil: the union of the phases'); canonical
	// names (see NormalizeCapabilities).
	Capabilities []string
}

// Sandbox is one live sandbox. Implementations are safe for concurrent use;
// calls after Destroy return an error of class NotFound.
type Sandbox interface {
	ID() string
	// Exec runs a command to completion, in the request's cwd (relative
	// to Workdir) or else in Workdir. Output is captured in the result up
	// to the request's cap; if streams are given, it is written to them
	// instead, as it is produced (up to the same cap). A command that runs but fails is
	// not an error: it is a result with a non-zero exit code. Errors are for
	// requests that could not run at all.
	Exec(ctx context.Context, req ExecRequest) (api.ExecResult, error)
	// Files is the sandbox's file system, confined to
	// Capabilities().FileRoot.
	Files() Files
	// Stats reports current resource usage.
	Stats(ctx context.Context) (Stats, error)
	// Destroy stops everything in the sandbox and frees its resources. It is
	// idempotent.
	Destroy(ctx context.Context) error
}

// ExecRequest is api.ExecRequest with live streams.
type ExecRequest struct {
	api.ExecRequest
	// Stdin, if set, is read instead of the request's Stdin string.
	Stdin io.Reader
	// Stdout and Stderr, if set, receive output as it is produced, and
	// the result's Stdout and Stderr are then empty (the caller has the
	// output); set both, as a nil one's output is dropped.
	Stdout, Stderr io.Writer
}

// Stats is a sandbox's resource usage.
type Stats = api.SandboxStats

// Files is a sandbox's file system. Paths are absolute within the sandbox
// or relative to Workdir, the directory commands start in; see CleanPath.
type Files interface {
	// Open opens a regular file for reading.
	Open(ctx context.Context, path string) (io.ReadCloser, api.FileInfo, error)
	// Write replaces path with the content of r, atomically: readers see
	// the old or the new file, never a part.
	Write(ctx context.Context, path string, r io.Reader, opt WriteOptions) (api.FileInfo, error)
	// List lists a directory, descending depth levels (depth ≥ 1).
	List(ctx context.Context, path string, depth int) ([]api.FileInfo, error)
	Stat(ctx context.Context, path string) (api.FileInfo, error)
	Mkdir(ctx context.Context, path string, parents bool) (api.FileInfo, error)
	Remove(ctx context.Context, path string, recursive bool) error
	Rename(ctx context.Context, from, to string) (api.FileInfo, error)
}

// WriteOptions tune Files.Write.
type WriteOptions struct {
	// Mode is the new file's permission bits; 0 means 0644.
	Mode uint32
	// Parents creates missing parent directories.
	Parents bool
	// MaxBytes, if positive, fails the write with TooLarge past that size.
	MaxBytes int64
}

// Phaser is implemented by sandboxes of tiers with staged permissions.
type Phaser interface {
	// SetPhase ends every process of the current phase and applies p's
	// permissions, atomically as the sandbox sees it (it is frozen
	// meanwhile).
	SetPhase(ctx context.Context, p api.Phase) error
	// Phase is the current phase's name ("" without phases).
	Phase() string
}

// ProcessRunner is implemented by sandboxes of tiers with background
// processes (Capabilities.Processes).
type ProcessRunner interface {
	StartProcess(ctx context.Context, req ExecRequest) (Process, error)
	Processes() []api.Process
	Process(pid int) (Process, error)
}

// Process is a background process.
type Process interface {
	Info() api.Process
	// Wait blocks until the process exits or ctx ends.
	Wait(ctx context.Context) (api.ExecResult, error)
	WriteStdin(ctx context.Context, p []byte) error
	CloseStdin() error
	Signal(sig string) error
}
