package container

import "testing"

func TestDying(t *testing.T) {
	status := func(pnd, shd, ign, cgt string) []byte {
		return []byte("Name:\tsleep\nSigQ:\t0/1\nSigPnd:\t" + pnd + "\nShdPnd:\t" + shd + "\nSigBlk:\t0000000000000000\nSigIgn:\t" + ign + "\nSigCgt:\t" + cgt + "\n")
	}
	const zero = "0000000000000000"
	for _, tc := range []struct {
		name   string
		status []byte
		want   bool
	}{
		{"nothing pending", status(zero, zero, zero, zero), false},
		{"SIGTERM pending, default action", status(zero, "0000000000004000", zero, zero), true},
		{"SIGKILL pending, even if caught", status("0000000000000100", zero, zero, "0000000000000100"), true},
		{"SIGTERM pending, caught", status(zero, "0000000000004000", zero, "0000000000004000"), false},
		{"SIGTERM pending, ignored", status(zero, "0000000000004000", "0000000000004000", zero), false},
		{"SIGURG pending (a Go runtime's preemption)", status("0000000000400000", zero, zero, zero), false},
		{"SIGCHLD pending", status(zero, "0000000000010000", zero, zero), false},
	} {
		if got := dying(tc.status); got != tc.want {
			t.Errorf("%s: dying=%v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestExiting(t *testing.T) {
	// pid (comm) state ppid pgrp session tty tpgid flags …
	if exiting([]byte("12 (a b) S 1 12 12 0 -1 4194560 0 0")) {
		t.Error("a running process's flags read as exiting")
	}
	if !exiting([]byte("12 (a) b) R 1 12 12 0 -1 4194564 0 0")) {
		t.Error("PF_EXITING not seen (comm with a parenthesis)")
	}
}
