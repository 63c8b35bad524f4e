package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// CommandsGroup names the child of a sandbox's v1 memory group that
// holds its commands (Limits.AgentMemoryBytes).
//
// Why a child. The OOM killer of a memory group chooses the task with
// the most memory of the whole group, and a sandbox's agent (PID 1) may
// be it: a command that fills a tmpfs holds little memory of its own,
// so at the limit the agent was killed, and the sandbox with it. With
// commands in a child limited to the sandbox's memory, they reach that
// limit before the group does, and the child's OOM killer chooses among
// them only. The group's limit is higher by what is set aside for the
// agent, which its own allocations (its heap, files the files API
// writes) come from.
//
// Why a thread. A v1 memory group holds threads, not processes, and a
// process's memory is charged to the group of its thread group leader.
// So the agent's leader stays in the group while the one thread that
// forks every command moves to the child: each command starts there,
// with no write per command, and the agent's own memory stays in the
// group. A v2 memory group holds whole processes; there a command would
// have to be cloned into the child (CLONE_INTO_CGROUP), which also takes
// it out of the group whose cgroup2 id the eBPF monitor watches, so v2
// has no child and its memory.oom.group=1 ends the whole sandbox at an
// OOM instead.
const CommandsGroup = "commands"

// groupMemory is the memory limit of the group itself for l (0: none).
func (l Limits) groupMemory() int64 {
	if l.MemoryBytes <= 0 {
		return 0
	}
	return l.MemoryBytes + l.AgentMemoryBytes
}

// commandsMemory is the memory limit of the commands group for l (0:
// none, or no such group).
func (l Limits) commandsMemory() int64 {
	if l.AgentMemoryBytes <= 0 {
		return 0
	}
	return l.MemoryBytes
}

// makeCommands makes the commands group if it is not there.
func (g *Group) makeCommands() error {
	if g.commands == "" {
		return fmt.Errorf("cgroup %s has no v1 memory group: %w", g.name, errdefs.ErrNotSupported)
	}
	if err := os.Mkdir(g.commands, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("making the commands group of cgroup %s: %w", g.name, err)
	}
	return nil
}

// AddCommandThread moves thread tid, alone, into the group's commands
// group (CommandsGroup): what the thread forks from then on starts
// there, is charged there and is OOM-killed there, while its process
// stays charged to the group itself (its leader's). tid must not be the
// leader of its thread group. It fails with an error wrapping
// errdefs.ErrNotSupported on v2 hosts and for a group made without
// Limits.AgentMemoryBytes.
func (g *Group) AddCommandThread(tid int) error {
	if tid <= 0 {
		return errdefs.New(errdefs.Invalid, api.CodeInvalidPid, "thread %d", tid)
	}
	if g.commands == "" {
		return fmt.Errorf("cgroup %s: a commands group needs a v1 memory hierarchy: %w", g.name, errdefs.ErrNotSupported)
	}
	err := writeFile(filepath.Join(g.commands, "tasks"), strconv.Itoa(tid))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cgroup %s has no commands group: %w", g.name, errdefs.ErrNotSupported)
	}
	return err
}

// commandsOOMKills is the OOM kills counted in the commands group (v1
// counts them where the limit was hit, not in its parents); 0 without
// one.
func (g *Group) commandsOOMKills() int64 {
	if g.commands == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(g.commands, "memory.oom_control"))
	if err != nil {
		return 0
	}
	return keyValue(string(b), "oom_kill")
}

// OwnOOMKills counts the OOM kills at the group's own limit since it was
// made: on v1 and hybrid hosts without those of its commands group, so
// that a rise means the OOM killer chose a task outside it (a sandbox's
// agent); on v2, every OOM kill of the group.
func (g *Group) OwnOOMKills() int64 {
	var r reads
	if g.m.mode == V2 {
		return r.key(g.unified, "memory.events", "oom_kill")
	}
	return r.key(g.memory, "memory.oom_control", "oom_kill")
}

// SplitsCommands reports whether the group can have a commands group
// (v1 and hybrid hosts).
func (g *Group) SplitsCommands() bool { return g.commands != "" }
