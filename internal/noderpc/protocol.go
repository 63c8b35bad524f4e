// Package noderpc is the protocol between the control plane and node
// agents, carried over NATS request/reply: subjects, messages, error
// encoding, and the client the control plane uses. The serving side lives
// in package node.
//
// Every operation is a request on dsec.node.<node>.<op> with a JSON body.
// Replies carry a JSON body on success; errors carry the class and code in
// headers and the user-facing message in the body. Exec replies may be a
// sequence of messages (output chunks, then the exit message), all sent to
// the request's reply subject in order.
package noderpc

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/layerspec"
)

// Operations.
const (
	OpCreate     = "create"
	OpDestroy    = "destroy"
	OpList       = "list"
	OpExec       = "exec"
	OpCancel     = "cancel"
	OpProcStart  = "proc.start"
	OpProcList   = "proc.list"
	OpProcGet    = "proc.get"
	OpProcWait   = "proc.wait"
	OpProcStdin  = "proc.stdin"
	OpProcClose  = "proc.closestdin"
	OpProcSignal = "proc.signal"
	OpFileOpen   = "fs.open"
	OpFileRead   = "fs.read"
	OpFileClose  = "fs.close"
	OpFileWrite  = "fs.write"
	OpFileList   = "fs.list"
	OpFileStat   = "fs.stat"
	OpFileMkdir  = "fs.mkdir"
	OpFileRemove = "fs.remove"
	OpFileRename = "fs.rename"
	OpStats      = "stats"
	OpSetPhase   = "phase"
	OpSnapshot   = "snapshot"
	OpStored     = "snapshot.stored"
)

// Headers.
const (
	HdrErrClass = "Dsec-Err-Class"
	HdrErrCode  = "Dsec-Err-Code"
	// HdrErrRetryAfter is an error's retry hint in milliseconds.
	HdrErrRetryAfter = "Dsec-Err-Retry-After-Ms"
	// HdrKind marks the messages of an exec reply: stdout, stderr, exit.
	HdrKind = "Dsec-Kind"
	// HdrSeq numbers the messages of an exec reply from 1, so a lost
	// message is detected instead of silently dropping output.
	HdrSeq = "Dsec-Seq"
	// HdrEOF is set on the last chunk of a file read.
	HdrEOF = "Dsec-Eof"
)

// ChunkSize is the largest file or output chunk in one message; it stays
// under a stock NATS server's 1 MiB payload limit.
const ChunkSize = 512 << 10

// InlineOutput is the most output an exec reply carries inside its final
// message; more is sent as chunks first.
const InlineOutput = 256 << 10

var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidNodeID reports whether id can name a node (it is a subject token).
func ValidNodeID(id string) bool { return nodeIDPattern.MatchString(id) }

// Subject is the subject of operation op on node.
func Subject(node, op string) string { return "dsec.node." + node + "." + op }

// SubjectAll matches every operation of node.
func SubjectAll(node string) string { return "dsec.node." + node + ".>" }

// ImageRef names an image and where it comes from: its layers (bottom
// first), or a directory source for development images.
type ImageRef struct {
	ID     string     `json:"id"`
	Name   string     `json:"name"`
	Source string     `json:"source"`
	Layers []LayerRef `json:"layers,omitempty"`
}

// LayerRef is a layer and its manifest, which names its files in the
// blob store.
type LayerRef = layerspec.Layer

// CreateRequest asks a node to create a sandbox.
type CreateRequest struct {
	ID       string            `json:"id"`
	Tier     string            `json:"tier"`
	Image    ImageRef          `json:"image"`
	CPU      float64           `json:"cpu"`
	MemoryMB int               `json:"memory_mb"`
	DiskMB   int               `json:"disk_mb"`
	Env      map[string]string `json:"env,omitempty"`
	// Network is the sandbox's network policy (nil: no egress).
	Network *api.NetworkPolicy `json:"network,omitempty"`
	// Phases are the task's phases; the sandbox starts in the first.
	Phases []api.Phase `json:"phases,omitempty"`
	// Capabilities are the commands' capabilities (see
	// api.CreateSandboxRequest), checked by the control plane.
	Capabilities []string `json:"capabilities,omitempty"`
}

// SetPhaseRequest moves sandbox ID to Phase (one of its phases, which
// the control plane checked).
type SetPhaseRequest struct {
	ID    string    `json:"id"`
	Phase api.Phase `json:"phase"`
}

// Target names a sandbox on a node.
type Target struct {
	ID string `json:"id"`
}

// SandboxStatus is one sandbox a node runs.
type SandboxStatus struct {
	ID   string `json:"id"`
	Tier string `json:"tier"`
}

// ListResponse is the reply to OpList.
type ListResponse struct {
	Sandboxes []SandboxStatus `json:"sandboxes"`
}

// ExecRequest runs a command (OpExec) or starts a process (OpProcStart).
type ExecRequest struct {
	ID string `json:"id"`
	// Call identifies the call for OpCancel.
	Call string          `json:"call"`
	Req  api.ExecRequest `json:"req"`
	// Stream asks for output chunks as they are produced.
	Stream bool `json:"stream,omitempty"`
	// Step is the trajectory step the command is (0: none); the node
	// tags the audit events of the command's time with it.
	Step int `json:"step,omitempty"`
	// Track asks whether the command was pure (StepInfo in the exit
	// message). Untracked commands cost nothing extra.
	Track bool `json:"track,omitempty"`
}

// StepInfo says whether a tracked command was pure: it changed nothing
// a later step could see (see sandbox.StepTracker). Tracked is false on
// tiers that cannot tell (Why says so); such a step is not pure.
type StepInfo struct {
	Tracked bool   `json:"tracked"`
	Pure    bool   `json:"pure"`
	Why     string `json:"why,omitempty"`
}

// ExitMessage is the body of an exec reply's exit message: the result
// and, for a tracked command, its StepInfo (a client that does not know
// the field reads the result alone).
type ExitMessage struct {
	api.ExecResult
	StepInfo *StepInfo `json:"step_info,omitempty"`
}

// CancelRequest cancels a call.
type CancelRequest struct {
	Call string `json:"call"`
}

// ProcRequest addresses a background process.
type ProcRequest struct {
	ID     string  `json:"id"`
	Pid    int     `json:"pid"`
	Data   []byte  `json:"data,omitempty"`
	Signal string  `json:"signal,omitempty"`
	WaitS  float64 `json:"wait_s,omitempty"`
}

// FileRequest is the body of the fs.* operations.
type FileRequest struct {
	ID        string `json:"id"`
	Path      string `json:"path,omitempty"`
	To        string `json:"to,omitempty"`
	Depth     int    `json:"depth,omitempty"`
	Recursive bool   `json:"recursive,omitempty"`
	Parents   bool   `json:"parents,omitempty"`
	Mode      uint32 `json:"mode,omitempty"`
	MaxBytes  int64  `json:"max_bytes,omitempty"`
	// Handle names an open read or write session.
	Handle string `json:"handle,omitempty"`
	// Offset of a read chunk; reads are sequential.
	Offset int64 `json:"offset,omitempty"`
	// Final marks the last chunk of a write (its data is the message
	// payload after the JSON header line).
	Final bool `json:"final,omitempty"`
	// Step is the trajectory step the operation is (0: none), for the
	// audit events of its time.
	Step int `json:"step,omitempty"`
}

// OpenResponse is the reply to fs.open.
type OpenResponse struct {
	Handle string       `json:"handle"`
	Info   api.FileInfo `json:"info"`
}

// WriteResponse is the reply to each fs.write chunk: the session handle,
// and the file's info once the final chunk is written.
type WriteResponse struct {
	Handle string        `json:"handle"`
	Info   *api.FileInfo `json:"info,omitempty"`
}

// EncodeError turns err into reply headers and body.
func EncodeError(msg *nats.Msg, err error) {
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	msg.Header.Set(HdrErrClass, string(errdefs.ClassOf(err)))
	msg.Header.Set(HdrErrCode, errdefs.CodeOf(err))
	if d := errdefs.RetryAfterOf(err); d > 0 {
		msg.Header.Set(HdrErrRetryAfter, strconv.FormatInt(d.Milliseconds(), 10))
	}
	msg.Data = []byte(errdefs.MessageOf(err))
}

// DecodeError returns the error a reply carries, or nil.
func DecodeError(msg *nats.Msg) error {
	class := msg.Header.Get(HdrErrClass)
	if class == "" {
		if len(msg.Data) == 0 && msg.Header.Get("Status") == "503" {
			return errdefs.New(errdefs.Unavailable, api.CodeNodeUnavailable, "node is not reachable")
		}
		return nil
	}
	e := errdefs.New(errdefs.ParseClass(class), msg.Header.Get(HdrErrCode), "%s", msg.Data)
	if ms, err := strconv.ParseInt(msg.Header.Get(HdrErrRetryAfter), 10, 64); err == nil && ms > 0 {
		e.RetryAfter = time.Duration(ms) * time.Millisecond
	}
	return e
}

// errNoResponders maps NATS's "nobody is listening" to a node error.
func mapNATSError(node string, err error) error {
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return errdefs.Wrap(errdefs.Unavailable, api.CodeNodeUnavailable, err, "node %s is not reachable", node)
	case errors.Is(err, nats.ErrTimeout):
		return errdefs.Wrap(errdefs.DeadlineExceeded, api.CodeNodeTimeout, err, "node %s did not answer in time", node)
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDrainTimeout):
		return errdefs.Wrap(errdefs.Unavailable, api.CodeBusClosed, err, "control plane is shutting down")
	}
	return fmt.Errorf("node %s: %w", node, err)
}

// SnapshotRequest asks for a snapshot of sandbox ID's writable state
// (OpSnapshot). Full ignores what the node's last snapshot of it stored.
type SnapshotRequest struct {
	ID   string `json:"id"`
	Full bool   `json:"full,omitempty"`
	// Background answers once the layer is built and in the node's own
	// layer cache, and stores it in the blob store meanwhile (a fork's
	// children start from it on this node while it uploads). The reply
	// then has Stored false and no Bytes; OpStored waits for the upload.
	Background bool `json:"background,omitempty"`
}

// StoredRequest waits for the upload of a layer a Background snapshot
// of sandbox ID made (OpStored); the reply is a StoredReply.
type StoredRequest struct {
	ID    string   `json:"id"`
	Layer LayerRef `json:"layer"`
}

// StoredReply: the layer's files are all in the blob store; Bytes are
// those it did not hold before.
type StoredReply struct {
	Bytes int64 `json:"bytes"`
}

// SnapshotReply is the state layer a snapshot made, stored in the
// node's blob store. Stacked on the sandbox's image layers and its
// earlier state layers (all of them since the last Full one, in order),
// it gives the sandbox's file system as it was. Full says the layer
// stands on the image layers alone: the request asked so, or the node
// had no index of an earlier snapshot (it restarted).
type SnapshotReply struct {
	Layer LayerRef `json:"layer"`
	Full  bool     `json:"full"`
	// Stored says the layer is in the blob store (false only for a
	// Background snapshot).
	Stored bool `json:"stored"`
	// Bytes are the bytes the blob store did not hold before; Files the
	// entries the layer holds (whiteouts included).
	Bytes int64 `json:"bytes"`
	Files int   `json:"files"`
	// Entries is the size of the writable state, in entries.
	Entries int `json:"entries"`
	// FrozenMS is how long the sandbox was held still; TotalMS the whole
	// snapshot's time (the layer's build and upload after the thaw).
	FrozenMS float64 `json:"frozen_ms"`
	TotalMS  float64 `json:"total_ms"`
}
