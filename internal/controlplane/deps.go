package controlplane

import (
	"context"
	"io"
	"log/slog"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/noderpc"
	"github.com/dsec-dev/dsec/internal/store"
)

// The manager's dependencies, as the manager uses them. The daemon passes
// *store.Store and *noderpc.Client; the package's tests pass in-memory
// fakes, so that the control plane's decisions (placement, lifecycle,
// reconciliation, the reaper) are checked in seconds, without NATS or a
// node.

// sandboxRecords holds the durable sandbox records. Updates are
// compare-and-set on the record's revision: a stale revision fails with
// errdefs.Conflict, and the caller re-reads and retries.
type sandboxRecords interface {
	GetSandbox(ctx context.Context, id string) (store.SandboxRecord, uint64, error)
	CreateSandbox(ctx context.Context, r store.SandboxRecord) (uint64, error)
	UpdateSandbox(ctx context.Context, r store.SandboxRecord, rev uint64) (uint64, error)
	PurgeSandbox(ctx context.Context, id string) error
	// WatchSandboxes delivers every record, then nil, then changes,
	// skipping this writer's own (see store.Store.WatchSandboxes).
	WatchSandboxes(ctx context.Context, log *slog.Logger, known func(id string, rev uint64) bool, fn func(*store.SandboxChange)) error
}

// eventLog keeps lifecycle events and the monitor's audit events.
type eventLog interface {
	PublishEvent(ctx context.Context, e store.Event) error
	AuditEvents(ctx context.Context, id string, skip, limit int) ([]api.AuditEvent, error)
	FollowAuditEvents(ctx context.Context, id string, skip int, fn func(api.AuditEvent) error) error
}

// snapshotRecords says whose each snapshot is.
type snapshotRecords interface {
	PutSnapshot(ctx context.Context, r store.SnapshotRecord) error
	UpdateSnapshot(ctx context.Context, r store.SnapshotRecord) error
	GetSnapshot(ctx context.Context, id string) (store.SnapshotRecord, error)
	DeleteSnapshot(ctx context.Context, id string) error
	ListSnapshots(ctx context.Context) ([]store.SnapshotRecord, error)
}

// stateStore is the store: records, events and the nodes' heartbeats.
type stateStore interface {
	sandboxRecords
	eventLog
	snapshotRecords
	requestRecords
	ListNodes(ctx context.Context) ([]api.Node, error)
	// SetNodeAdmin records what an operator set on a node (drain.go).
	SetNodeAdmin(ctx context.Context, id string, a store.NodeAdmin) error
}

// requestRecords keeps idempotent creates' keys (see idempotent.go).
type requestRecords interface {
	ClaimRequest(ctx context.Context, key string, rec store.RequestRecord) (store.RequestRecord, bool, error)
	ReleaseRequest(ctx context.Context, key string) error
}

// nodeLifecycle makes and ends sandboxes on nodes and hears of those
// that end by themselves.
type nodeLifecycle interface {
	Create(ctx context.Context, node string, req noderpc.CreateRequest) error
	Destroy(ctx context.Context, node, id string) error
	List(ctx context.Context, node string) ([]noderpc.SandboxStatus, error)
	SetPhase(ctx context.Context, node, id string, p api.Phase) error
	// Snapshot stores a sandbox's writable state as a layer.
	Snapshot(ctx context.Context, node, id string, req noderpc.SnapshotRequest) (noderpc.SnapshotReply, error)
	// Stored waits for a Background snapshot's upload.
	Stored(ctx context.Context, node, id string, layer noderpc.LayerRef) (noderpc.StoredReply, error)
	ServeEnded(handle func(noderpc.EndedReport) error) (stop func(), err error)
}

// nodeCommands runs commands and processes in a node's sandbox.
type nodeCommands interface {
	Exec(ctx context.Context, node, id string, req api.ExecRequest, out *noderpc.Output) (api.ExecResult, error)
	// ExecStep is Exec as step n of a trajectory: the node says whether
	// the command changed the sandbox's state.
	ExecStep(ctx context.Context, node, id string, step int, req api.ExecRequest, out *noderpc.Output) (api.ExecResult, noderpc.StepInfo, error)
	StartProcess(ctx context.Context, node, id string, req api.ExecRequest) (api.Process, error)
	ListProcesses(ctx context.Context, node, id string) ([]api.Process, error)
	GetProcess(ctx context.Context, node, id string, pid int) (api.Process, error)
	WaitProcess(ctx context.Context, node, id string, pid int, waitS float64) (api.ExecResult, error)
	SendStdin(ctx context.Context, node, id string, pid int, data []byte) error
	CloseStdin(ctx context.Context, node, id string, pid int) error
	Signal(ctx context.Context, node, id string, pid int, sig string) error
	Stats(ctx context.Context, node, id string) (api.SandboxStats, error)
}

// nodeFiles reaches a node's sandbox's files.
type nodeFiles interface {
	OpenFile(ctx context.Context, node, id, path string) (io.ReadCloser, api.FileInfo, error)
	WriteFile(ctx context.Context, node, id, path string, r io.Reader, opt noderpc.FileRequest) (api.FileInfo, error)
	ListFiles(ctx context.Context, node, id, path string, depth int) ([]api.FileInfo, error)
	Stat(ctx context.Context, node, id, path string) (api.FileInfo, error)
	Mkdir(ctx context.Context, node, id, path string, parents bool) (api.FileInfo, error)
	Remove(ctx context.Context, node, id, path string, recursive bool) error
	Rename(ctx context.Context, node, id, from, to string) (api.FileInfo, error)
}

// nodeClient is the protocol to the nodes (noderpc.Client).
type nodeClient interface {
	nodeLifecycle
	nodeCommands
	nodeFiles
}

var (
	_ stateStore = (*store.Store)(nil)
	_ nodeClient = (*noderpc.Client)(nil)
)
