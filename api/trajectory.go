package api

import "time"

// Trajectories: the durable log of a rollout (docs/design/trajectories.md).
// A sandbox created with a trajectory appends every interaction to it, in
// order, before the API answers; resume replays it into a fresh sandbox,
// and snapshots and forks start new sandboxes from a logged state.

// Step kinds (TrajectoryStep.Kind).
const (
	KindCreate   = "create"   // the sandbox's resolved spec
	KindExec     = "exec"     // a command and its result
	KindWrite    = "write"    // a file written (upload)
	KindMkdir    = "mkdir"    // a directory made
	KindRemove   = "remove"   // a path removed
	KindRename   = "rename"   // a path moved
	KindPhase    = "phase"    // a phase change
	KindSnapshot = "snapshot" // the writable state stored as a layer
	KindResume   = "resume"   // a new incarnation, rebuilt from the log
	KindEnd      = "end"      // the sandbox ended (deleted, expired, lost)
)

// Trajectory states.
const (
	TrajectoryRecording = "recording" // a sandbox appends to it
	TrajectoryResuming  = "resuming"  // a resume is replaying it
	TrajectoryDiverged  = "diverged"  // a replayed step did not match the log
	TrajectoryEnded     = "ended"     // no sandbox records to it
)

// On-divergence choices of a resume.
const (
	DivergenceStop     = "stop"     // keep the sandbox where the replay diverged (default)
	DivergenceContinue = "continue" // report the step and replay on
)

// Trajectory is a trajectory's head: who records it and how far it got
// (GET /v1/trajectories/{id}).
type Trajectory struct {
	// ID is the caller's name for it ("run-42/task-7/rollout-3"):
	// letters, digits and "-_./:", at most 200 bytes.
	ID    string `json:"id"`
	State string `json:"state"`
	// Sandbox records to it now (or did last).
	Sandbox string `json:"sandbox,omitempty"`
	Tier    string `json:"tier,omitempty"`
	// Parent and ParentStep name the trajectory this one was forked from
	// and the step of the parent's that it starts after.
	Parent     string `json:"parent,omitempty"`
	ParentStep int    `json:"parent_step,omitempty"`
	// Steps is the number of the last step; Bytes what the log and its
	// blobs hold.
	Steps int   `json:"steps"`
	Bytes int64 `json:"bytes"`
	// Snapshots are the states stored along the way, oldest first.
	Snapshots []Snapshot `json:"snapshots,omitempty"`
	// Incarnations counts the sandboxes that recorded it: 1, plus one per
	// resume.
	Incarnations int         `json:"incarnations"`
	Divergence   *Divergence `json:"divergence,omitempty"`
	// ResumeOnPreempt: the control plane resumes it elsewhere when its
	// node is lost, drained or reclaimed.
	ResumeOnPreempt bool      `json:"resume_on_preempt,omitempty"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
	ExpiresAt       time.Time `json:"expires_at"`
}

// TrajectoryList is the body of GET /v1/trajectories.
type TrajectoryList struct {
	Trajectories  []Trajectory `json:"trajectories"`
	NextPageToken string       `json:"next_page_token,omitempty"`
}

// TrajectorySteps is the body of GET /v1/trajectories/{id}/steps: a page
// of steps in order, with the head.
type TrajectorySteps struct {
	Trajectory    Trajectory       `json:"trajectory"`
	Steps         []TrajectoryStep `json:"steps"`
	NextPageToken string           `json:"next_page_token,omitempty"`
}

// TrajectoryStep is one logged interaction. Exactly one of the kind's
// fields is set. The export (JSONL) is one step per line.
type TrajectoryStep struct {
	Trajectory string    `json:"trajectory"`
	Step       int       `json:"step"`
	Kind       string    `json:"kind"`
	At         time.Time `json:"at"`
	// Sandbox is the incarnation that ran the step.
	Sandbox    string  `json:"sandbox"`
	DurationMS float64 `json:"duration_ms,omitempty"`
	// Pure: the step changed nothing a later step could see (nothing
	// written to the writable layer, no process left running, no phase
	// change); replay skips it.
	Pure     bool              `json:"pure,omitempty"`
	Create   *StepCreate       `json:"create,omitempty"`
	Exec     *StepExec         `json:"exec,omitempty"`
	File     *StepFile         `json:"file,omitempty"`
	Phase    *SetPhaseRequest  `json:"phase,omitempty"`
	Snapshot *Snapshot         `json:"snapshot,omitempty"`
	Resume   *StepResume       `json:"resume,omitempty"`
	End      *StepEnd          `json:"end,omitempty"`
	Audit    []AuditEvent      `json:"audit,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
}

// StepCreate is the create spec as resolved: Image is the image's ID and
// Layers its layers by ID, so a resume builds the same root however names
// moved since. Secret env values are not in Request.Env; SecretEnv names
// them, and a resume must supply them again.
type StepCreate struct {
	Request   CreateSandboxRequest `json:"request"`
	SecretEnv []string             `json:"secret_env,omitempty"`
	// FromSnapshot is the snapshot the sandbox started from.
	FromSnapshot string `json:"from_snapshot,omitempty"`
}

// StepExec is a command and its result. Outputs longer than the server's
// inline limit are in the trajectory's blob store by digest
// (GET /v1/trajectories/{id}/blobs/{digest}); OutputDigest covers both
// streams whatever their size, and is what replay compares.
type StepExec struct {
	Request ExecRequest `json:"request"`
	// StdinDigest replaces Request.Stdin (sha256:…).
	StdinDigest     string `json:"stdin_digest,omitempty"`
	ExitCode        int    `json:"exit_code"`
	TimedOut        bool   `json:"timed_out,omitempty"`
	Stdout          string `json:"stdout,omitempty"`
	Stderr          string `json:"stderr,omitempty"`
	StdoutBlob      string `json:"stdout_blob,omitempty"`
	StderrBlob      string `json:"stderr_blob,omitempty"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	OutputDigest    string `json:"output_digest"`
	// Process: the command was started in the background (a process), not
	// waited for.
	Process bool `json:"process,omitempty"`
	Pid     int  `json:"pid,omitempty"`
}

// StepFile is a file operation. For a write, Digest and Size describe the
// content, kept in the blob store under Digest.
type StepFile struct {
	Path      string `json:"path"`
	To        string `json:"to,omitempty"`
	Digest    string `json:"digest,omitempty"`
	Size      int64  `json:"size,omitempty"`
	Mode      uint32 `json:"mode,omitempty"`
	Parents   bool   `json:"parents,omitempty"`
	Recursive bool   `json:"recursive,omitempty"`
}

// StepResume records a new incarnation: how many steps it replayed and
// skipped, from which snapshot.
type StepResume struct {
	From       string      `json:"from_snapshot,omitempty"`
	Replayed   int         `json:"replayed"`
	Skipped    int         `json:"skipped"`
	Reason     string      `json:"reason"` // "request", "preempted"
	Divergence *Divergence `json:"divergence,omitempty"`
}

// StepEnd records how the recording sandbox ended.
type StepEnd struct {
	Reason string `json:"reason"`
}

// Divergence is a replayed step whose result differed from the log.
type Divergence struct {
	Step     int    `json:"step"`
	Kind     string `json:"kind"`
	Logged   string `json:"logged"`
	Replayed string `json:"replayed"`
}

// Snapshot is a sandbox's writable state stored as a layer: a record of
// its own ("snap-…", with an owner) naming an image made of the
// sandbox's image and the state layers above it. Create with
// from_snapshot starts from it.
type Snapshot struct {
	ID         string    `json:"id"`
	Sandbox    string    `json:"sandbox,omitempty"`
	Trajectory string    `json:"trajectory,omitempty"`
	Step       int       `json:"step"`
	Tier       string    `json:"tier"`
	Image      string    `json:"image"`  // the image a sandbox from it runs
	Layers     []string  `json:"layers"` // state layers, bottom first
	Bytes      int64     `json:"bytes"`  // new bytes this snapshot stored
	CreatedAt  time.Time `json:"created_at"`
}

// ResumeRequest is the body of POST /v1/trajectories/{id}/resume.
type ResumeRequest struct {
	// SecretEnv gives the values of the create's secret env again.
	SecretEnv map[string]string `json:"secret_env,omitempty"`
	// OnDivergence is "stop" (default) or "continue".
	OnDivergence string `json:"on_divergence,omitempty"`
	// Tier overrides the logged tier (any tier with the capability).
	Tier string `json:"tier,omitempty"`
	// FromScratch ignores snapshots and replays from the create.
	FromScratch bool `json:"from_scratch,omitempty"`
	TimeoutS    int  `json:"timeout_s,omitempty"`
}

// ResumeResult is the answer to a resume: the new sandbox and what the
// replay did.
type ResumeResult struct {
	Sandbox    Sandbox     `json:"sandbox"`
	Replayed   int         `json:"replayed"`
	Skipped    int         `json:"skipped"`
	From       string      `json:"from_snapshot,omitempty"`
	DurationMS float64     `json:"duration_ms"`
	Divergence *Divergence `json:"divergence,omitempty"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	Count int `json:"count"`
	// TimeoutS and Labels apply to every child; defaults are the parent's.
	TimeoutS int               `json:"timeout_s,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
}

// ForkResult lists the children, in order, and the snapshot they share.
type ForkResult struct {
	Snapshot  Snapshot  `json:"snapshot"`
	Sandboxes []Sandbox `json:"sandboxes"`
}
