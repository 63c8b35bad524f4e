package container

import (
	"bytes"
	"strconv"
	"strings"
	"time"
)

// zombie reports whether a /proc/<pid>/stat line is of a zombie.
func zombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// pfExiting is the kernel's PF_EXITING task flag (field 9 of stat).
const pfExiting = 0x4

// exiting reports whether a /proc/<pid>/stat line is of a process that
// has begun to exit.
func exiting(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return false
	}
	// After ") ": state ppid pgrp session tty_nr tpgid flags.
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 7 {
		return false
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfExiting != 0
}

// notFatal are the signals whose default action is not to terminate
// (SIGCHLD, SIGCONT, SIGURG, SIGWINCH ignored; SIGSTOP, SIGTSTP,
// SIGTTIN, SIGTTOU stop), as bits of /proc/<pid>/status masks.
const notFatal = 1<<(17-1) | 1<<(18-1) | 1<<(23-1) | 1<<(28-1) | 1<<(19-1) | 1<<(20-1) | 1<<(21-1) | 1<<(22-1)

// sigkill is SIGKILL's bit: fatal whatever the process does.
const sigkill = 1 << (9 - 1)

// dying reports whether a /proc/<pid>/status text shows a pending signal
// (SigPnd, ShdPnd) that will end the process: SIGKILL, or one it neither
// catches nor ignores whose default is to terminate. (A Go agent's own
// SIGURG, which it catches, is not.)
func dying(status []byte) bool {
	m := map[string]uint64{}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		switch k {
		case "SigPnd", "ShdPnd", "SigIgn", "SigCgt":
			if !ok {
				continue
			}
			if n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil {
				m[k] = n
			}
		}
	}
	pending := m["SigPnd"] | m["ShdPnd"]
	return pending&sigkill != 0 || pending&^(m["SigIgn"]|m["SigCgt"]|notFatal) != 0
}

func sleepBrief() { time.Sleep(5 * time.Millisecond) }
