package sys

import (
	"errors"
	"io/fs"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestExitWatch watches a process that is not the test's child (a
// shell's background job, reparented when the shell exits): Wait
// returns when it is killed, at once, and Status says how, where the
// kernel can tell (PIDFD_INFO_EXIT, Linux 6.15).
func TestExitWatch(t *testing.T) {
	out, err := exec.Command("/bin/sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	w, err := WatchExit(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	done := make(chan error, 1)
	go func() { done <- w.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v while the process runs", err)
	case <-time.After(100 * time.Millisecond):
	}
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
		t.Logf("seen %v after the kill", time.Since(killed))
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return within 10 s of the process's SIGKILL")
	}
	// The process's parent (init or a subreaper) reaps it; the exit
	// information is there from then on.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ws, ok := w.Status()
		if ok {
			t.Logf("status %v after the kill", time.Since(killed))
			if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Errorf("Status = %#x, want killed by SIGKILL", int(ws))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Logf("no exit status from the kernel (PIDFD_INFO_EXIT needs Linux 6.15)")
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestExitWatchClose: Close ends a Wait in progress with fs.ErrClosed;
// a process that is gone cannot be watched.
func TestExitWatchClose(t *testing.T) {
	cmd := exec.Command("/bin/sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// bounded: sleep ends at SIGKILL
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	w, err := WatchExit(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Wait() }()
	time.Sleep(50 * time.Millisecond)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, fs.ErrClosed) {
			t.Errorf("Wait after Close: %v, want fs.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return within 10 s of Close")
	}
	_ = cmd.Process.Kill()
	// bounded: sleep ends at SIGKILL
	_ = cmd.Wait()
	if _, err := WatchExit(cmd.Process.Pid); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("WatchExit of a reaped process: %v, want fs.ErrNotExist", err)
	}
}
