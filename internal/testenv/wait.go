package testenv

import (
	"os/exec"
	"testing"
	"time"
)

// Every wait of a test is bounded and says what it waited for when it
// gives up: a hung package is never how a failure shows
// (TestWaitsBounded in this package enforces it). These helpers are the
// bounded forms of a channel receive, WaitGroup.Wait and Cmd.Wait.

// Recv waits up to d for a value from ch and returns it. When d passes
// it fails the test, saying it waited for what, with every goroutine's
// stack in the log.
func Recv[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		_, dump := goroutines()
		t.Logf("goroutines:\n%s", dump)
		t.Fatalf("timed out after %v waiting for %s", d, what)
		var zero T
		return zero
	}
}

// WaitGroup waits up to d for wg.Wait to return (a sync.WaitGroup, an
// errgroup); past d it fails the test as Recv does.
func WaitGroup(t testing.TB, wg interface{ Wait() }, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	Recv(t, done, d, what)
}

// WaitCmd waits up to d for the started cmd to exit and returns its
// Wait error. Past d it kills the process, reaps it (up to 10 s more:
// a process in uninterruptible sleep may not die) and fails the test.
func WaitCmd(t testing.TB, cmd *exec.Cmd, d time.Duration, what string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
	}
	_ = cmd.Process.Kill()
	select {
	case <-done:
		t.Fatalf("timed out after %v waiting for %s (pid %d, killed)", d, what, cmd.Process.Pid)
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out after %v waiting for %s (pid %d, not reaped 10 s after SIGKILL)", d, what, cmd.Process.Pid)
	}
	return nil
}

// Eventually polls cond every 20 ms until it holds, for up to d; past d
// it fails the test, saying what it waited for.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
