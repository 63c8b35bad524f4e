package agentproto

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// serveTest runs Serve with handle on one end of a socket pair and a
// Client on the other.
func serveTest(t *testing.T, handle func(*Call)) *Client {
	t.Helper()
	base := testenv.Goroutines()
	a, b := socketPair(t)
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), b, nil, handle) }()
	c := NewClient(a, nil)
	t.Cleanup(func() {
		c.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after the client closed")
		}
		testenv.GoroutinesSettle(t, base)
	})
	return c
}

// floodHandler answers exec calls by sending argv[1] bytes of argv[0]'s
// first letter on stdout, or echoing stdin back if argv[0] is "echo".
func floodHandler(c *Call) {
	var args ExecArgs
	if err := c.Decode(&args); err != nil {
		c.Reply(nil, err)
		return
	}
	c.Event(Started{Pid: 42})
	if args.Argv[0] == "echo" {
		for {
			b, err := c.Recv(c.Context())
			if err == io.EOF {
				break
			}
			if err != nil {
				c.Reply(nil, err)
				return
			}
			if err := c.Send(ChanOut, b); err != nil {
				c.Reply(nil, err)
				return
			}
		}
		c.Reply(api.ExecResult{}, nil)
		return
	}
	n, _ := strconv.Atoi(args.Argv[1])
	for sent := 0; sent < n; sent += ChunkSize {
		if err := c.Send(ChanOut, bytes.Repeat([]byte(args.Argv[0][:1]), min(ChunkSize, n-sent))); err != nil {
			c.Reply(nil, err)
			return
		}
	}
	c.Reply(api.ExecResult{}, nil)
}

// size makes an argv that asks floodHandler for n bytes.
func size(letter string, n int) []string { return []string{letter, strconv.Itoa(n)} }

// TestStalledCallDoesNotBlockOthers: a call whose consumer stops reading
// does not hold up the others on the connection.
func TestStalledCallDoesNotBlockOthers(t *testing.T) {
	c := serveTest(t, floodHandler)
	release := make(chan struct{})
	stalled := call(func() error {
		var got int
		once := sync.Once{}
		_, err := c.Exec(context.Background(), ExecRequest{Argv: size("s", 16<<20), MaxOutputBytes: 32 << 20}, Output{Stdout: func(b []byte) {
			// bounded: the consumer stalls until the test's close(release)
			once.Do(func() { <-release })
			got += len(b)
		}})
		if err == nil && got != 16<<20 {
			err = errors.New("short output")
		}
		return err
	})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			letter := string(rune('a' + i))
			res, err := c.Exec(context.Background(), ExecRequest{Argv: size(letter, 3<<20), MaxOutputBytes: 4 << 20}, Output{})
			if err != nil || res.Stdout != strings.Repeat(letter, 3<<20) {
				t.Errorf("call %s: %d bytes, %v", letter, len(res.Stdout), err)
			}
		}()
	}
	testenv.WaitGroup(t, &wg, 2*time.Minute, "the concurrent calls")
	select {
	case err := <-stalled:
		t.Fatalf("the stalled call ended: %v", err)
	default:
	}
	close(release)
	if err := wait(t, stalled, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestStdinStreamRoundTrip streams a large stdin through a call and back.
func TestStdinStreamRoundTrip(t *testing.T) {
	c := serveTest(t, floodHandler)
	in := bytes.Repeat([]byte("stdin-"), 1<<20)
	res, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"echo"}, StdinReader: bytes.NewReader(in), MaxOutputBytes: 8 << 20}, Output{})
	if err != nil || res.Stdout != string(in) {
		t.Fatalf("echo: %d bytes, %v", len(res.Stdout), err)
	}
	// A long stdin string is streamed too.
	res, err = c.Exec(context.Background(), ExecRequest{Argv: []string{"echo"}, Stdin: string(in[:1<<20])}, Output{})
	if err != nil || res.Stdout != string(in[:1<<20]) {
		t.Fatalf("echo string: %d bytes, %v", len(res.Stdout), err)
	}
}

// TestCancelReachesHandler: cancelling a call's context cancels the
// handler's, promptly.
func TestCancelReachesHandler(t *testing.T) {
	cancelled := make(chan struct{})
	c := serveTest(t, func(c *Call) {
		// bounded: the handler's context ends with the call
		<-c.Context().Done()
		close(cancelled)
		c.Reply(nil, c.Context().Err())
	})
	ctx, cancel := context.WithCancel(context.Background())
	errc := call(func() error { _, err := c.Exec(ctx, ExecRequest{Argv: []string{"x"}}, Output{}); return err })
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := wait(t, errc, 5*time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v", err)
	}
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler was not cancelled")
	}
}

func TestHandlerWithoutReply(t *testing.T) {
	c := serveTest(t, func(c *Call) {})
	_, err := c.Stat(context.Background(), "/")
	if !errors.Is(err, errdefs.Internal) || errdefs.CodeOf(err) != "no_reply" {
		t.Errorf("err = %v", err)
	}
}

func TestExecTimeout(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want time.Duration
	}{
		{0, DefaultExecTimeout},
		{-1, DefaultExecTimeout},
		{math.NaN(), DefaultExecTimeout},
		{0.5, 500 * time.Millisecond},
		{1e300, MaxExecTimeout},
		{math.Inf(1), MaxExecTimeout},
	} {
		if got := ExecTimeout(tc.in); got != tc.want {
			t.Errorf("ExecTimeout(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestHandlerPanic(t *testing.T) {
	c := serveTest(t, func(c *Call) { panic("boom") })
	_, err := c.Stat(context.Background(), "/")
	if !errors.Is(err, errdefs.Internal) || errdefs.CodeOf(err) != "agent_panic" {
		t.Errorf("err = %v", err)
	}
	if _, err := c.Stat(context.Background(), "/"); errdefs.CodeOf(err) != "agent_panic" {
		t.Errorf("the connection did not survive: %v", err)
	}
}
