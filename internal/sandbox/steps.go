package sandbox

import (
	"context"
	"crypto/sha256"
	"os"
	"slices"
)

// StepTracker is implemented by sandboxes whose tier can tell whether a
// command changed anything a later command could see (a "pure" step,
// which a trajectory's replay skips). The node calls BeginStep right
// before a tracked exec and EndStep right after it; untracked execs pay
// nothing.
//
// A tier must never call a step pure that was not: when it cannot judge
// (its handle on the writable state is gone, after a node restart), the
// mark says so and EndStep answers not pure, why WhyUnknown.
type StepTracker interface {
	BeginStep(ctx context.Context) (StepMark, error)
	// EndStep compares the sandbox now with m: pure is true when nothing
	// changed; otherwise why is one of the Why… reasons.
	EndStep(ctx context.Context, m StepMark) (pure bool, why string, err error)
}

// MarkDropper is a StepTracker that keeps the last step's closing mark
// as the next one's opening mark. The node drops it after a change it
// made itself (a files-API call, a phase change): that change is a step
// of its own and must not count against the next command.
type MarkDropper interface {
	DropMark()
}

// Reasons a step is not pure.
const (
	WhyWrites    = "writes"    // the writable state changed
	WhyProcesses = "processes" // a process started (or ended) and outlived the command
	WhyUnknown   = "unknown"   // the tier could not look (see StepMark.Unknown)
)

// StepMark is the state a step began in: a digest of the writable
// state's entries and the sandbox's processes.
type StepMark struct {
	Tree  [sha256.Size]byte
	Procs []int // sorted
	// Unknown, when set, says why the state could not be read: a step
	// that begins so is never pure.
	Unknown string
}

// CompareMarks is EndStep for tiers that build a second mark after the
// step: pure when both trees and process sets are equal.
func CompareMarks(before, after StepMark) (bool, string) {
	switch {
	case before.Unknown != "" || after.Unknown != "":
		return false, WhyUnknown
	case before.Tree != after.Tree:
		return false, WhyWrites
	case !slices.Equal(before.Procs, after.Procs):
		return false, WhyProcesses
	}
	return true, ""
}

// TreeMark digests every entry under root: its path, type, mode, owner,
// size, modification and change times in nanoseconds, device number and
// symlink target. Change times cannot be set by a sandbox, and tmpfs
// keeps them fine-grained once they were read (multigrain timestamps),
// so any write after a mark changes the next one, a same-size overwrite
// of one byte included. Entries that vanish while it walks are digested
// as gone. It also returns the number of entries.
func TreeMark(ctx context.Context, root *os.Root) ([sha256.Size]byte, int, error) {
	return treeMark(ctx, root)
}
