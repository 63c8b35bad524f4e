package agentproto

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// fakeAgent is the agent end of a connection, scripted frame by frame by
// a test: here, a hostile or broken agent.
type fakeAgent struct {
	t    *testing.T
	conn net.Conn
	hdr  [HeaderSize]byte
}

// socketPair returns both ends of a connected Unix socket pair.
func socketPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := sys.Socketpair(syscall.SOCK_STREAM)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// newHostile returns a client and the fake agent it talks to, and checks
// at the end of the test that the client left no goroutines behind.
func newHostile(t *testing.T) (*Client, *fakeAgent) {
	t.Helper()
	base := testenv.Goroutines()
	a, b := socketPair(t)
	c := NewClient(a, nil)
	fa := &fakeAgent{t: t, conn: b}
	t.Cleanup(func() {
		c.Close()
		b.Close()
		testenv.GoroutinesSettle(t, base)
	})
	return c, fa
}

func (f *fakeAgent) read() Frame {
	f.t.Helper()
	f.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	fr, err := ReadFrame(f.conn, &f.hdr)
	if err != nil {
		f.t.Fatalf("fake agent: reading: %v", err)
	}
	return fr
}

// readOpen reads frames up to the next Open and returns it and its op.
func (f *fakeAgent) readOpen() (Frame, Request) {
	f.t.Helper()
	for {
		fr := f.read()
		if fr.Type == FrameOpen {
			var req Request
			if err := json.Unmarshal(fr.Payload, &req); err != nil {
				f.t.Fatal(err)
			}
			return fr, req
		}
	}
}

func (f *fakeAgent) write(fr Frame) error {
	f.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	var b []byte
	b = fr.AppendHeader(b)
	_, err := f.conn.Write(append(b, fr.Payload...))
	return err
}

func (f *fakeAgent) reply(stream uint32, result any) {
	raw, _ := json.Marshal(result)
	payload, _ := json.Marshal(Reply{Result: raw})
	f.write(Frame{Type: FrameReply, Stream: stream, Payload: payload})
}

// wantBroken checks that err is the protocol-violation error and that the
// client's connection is closed.
func wantBroken(t *testing.T, c *Client, err error) {
	t.Helper()
	if !errors.Is(err, errdefs.Unavailable) || errdefs.CodeOf(err) != "agent_protocol_error" {
		t.Errorf("err = %v (code %s), want Unavailable agent_protocol_error", err, errdefs.CodeOf(err))
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the client kept the connection to a broken agent")
	}
	if _, err := c.Stat(context.Background(), "/x"); errdefs.CodeOf(err) != "agent_protocol_error" {
		t.Errorf("a call after the violation: %v", err)
	}
}

// call runs fn in a goroutine and returns its error channel.
func call(fn func() error) chan error {
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	return ch
}

func wait(t *testing.T, ch chan error, within time.Duration) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(within):
		t.Fatalf("the call did not end within %v", within)
		return nil
	}
}

func TestHostileOversizedFrame(t *testing.T) {
	c, fa := newHostile(t)
	errc := call(func() error { _, err := c.Stat(context.Background(), "/x"); return err })
	other := call(func() error {
		_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"x"}}, Output{})
		return err
	})
	fr, _ := fa.readOpen()
	fa.readOpen()
	// A header announcing 2 GiB: the client must refuse it without
	// allocating or waiting for the payload.
	hdr := Frame{Type: FrameReply, Stream: fr.Stream}
	b := hdr.AppendHeader(nil)
	binary.BigEndian.PutUint32(b[8:], 2<<30)
	fa.conn.Write(b)
	wantBroken(t, c, wait(t, errc, 5*time.Second))
	if err := wait(t, other, 5*time.Second); errdefs.CodeOf(err) != "agent_protocol_error" {
		t.Errorf("the other call: %v", err)
	}
}

func TestHostileGarbage(t *testing.T) {
	c, fa := newHostile(t)
	errc := call(func() error { _, err := c.Hello(context.Background()); return err })
	fa.readOpen()
	garbage := make([]byte, 4096)
	for i := range garbage {
		garbage[i] = byte(rand.IntN(256))
	}
	garbage[0] = 0xff // an unknown frame type
	fa.conn.Write(garbage)
	wantBroken(t, c, wait(t, errc, 5*time.Second))
}

func TestHostileBadJSON(t *testing.T) {
	for _, tc := range []struct {
		name  string
		frame func(stream uint32) Frame
	}{
		{"reply", func(s uint32) Frame { return Frame{Type: FrameReply, Stream: s, Payload: []byte("{not json")} }},
		{"result", func(s uint32) Frame {
			return Frame{Type: FrameReply, Stream: s, Payload: []byte(`{"result":{"size":"big"}}`)}
		}},
		{"event", func(s uint32) Frame { return Frame{Type: FrameEvent, Stream: s, Payload: []byte("[[[")} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, fa := newHostile(t)
			errc := call(func() error {
				_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"x"}}, Output{})
				if err == nil {
					_, err = c.Stat(context.Background(), "/x")
				}
				return err
			})
			fr, req := fa.readOpen()
			if req.Op == OpExec && tc.name == "result" {
				fa.reply(fr.Stream, api.ExecResult{})
				fr, _ = fa.readOpen()
			}
			fa.write(tc.frame(fr.Stream))
			wantBroken(t, c, wait(t, errc, 5*time.Second))
		})
	}
}

func TestHostileWindowOverrun(t *testing.T) {
	c, fa := newHostile(t)
	// The consumer stalls on the first chunk, so no credit is granted.
	release := make(chan struct{})
	defer close(release)
	errc := call(func() error {
		// bounded: the consumer stalls until the deferred close(release)
		_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"x"}}, Output{Stdout: func([]byte) { <-release }})
		return err
	})
	fr, _ := fa.readOpen()
	// The whole window, then one byte more without waiting for credit.
	chunk := make([]byte, ChunkSize)
	for sent := 0; sent < InitialWindow; sent += ChunkSize {
		fa.write(Frame{Type: FrameData, Channel: ChanOut, Stream: fr.Stream, Payload: chunk})
	}
	fa.write(Frame{Type: FrameData, Channel: ChanOut, Stream: fr.Stream, Payload: []byte("!")})
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the client accepted data beyond the window")
	}
	release <- struct{}{} // the stalled callback returns; the call sees the end
	wantBroken(t, c, wait(t, errc, 5*time.Second))
}

func TestHostileWrongDirection(t *testing.T) {
	for _, tc := range []struct {
		name  string
		frame func(stream uint32) Frame
	}{
		{"stdin data", func(s uint32) Frame { return Frame{Type: FrameData, Channel: ChanIn, Stream: s, Payload: []byte("x")} }},
		{"agent opens a call", func(s uint32) Frame { return Frame{Type: FrameOpen, Stream: s + 100, Payload: []byte(`{"op":"x"}`)} }},
		{"agent cancels", func(s uint32) Frame { return Frame{Type: FrameCancel, Stream: s} }},
		{"data after EOF", func(s uint32) Frame { return Frame{Type: FrameData, Channel: ChanOut, Flags: FlagEOF, Stream: s} }},
		{"window overflow", func(s uint32) Frame {
			return Frame{Type: FrameWindow, Stream: s, Payload: windowPayload(MaxWindow)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, fa := newHostile(t)
			errc := call(func() error {
				_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"x"}}, Output{})
				return err
			})
			fr, _ := fa.readOpen()
			fa.write(tc.frame(fr.Stream))
			if tc.name == "data after EOF" {
				fa.write(Frame{Type: FrameData, Channel: ChanOut, Stream: fr.Stream, Payload: []byte("late")})
			}
			wantBroken(t, c, wait(t, errc, 5*time.Second))
		})
	}
}

func TestHostileEventFlood(t *testing.T) {
	c, fa := newHostile(t)
	// The consumer stalls on the first event, so the others queue up.
	release := make(chan struct{})
	errc := call(func() error {
		// bounded: the consumer stalls until the test's close(release)
		_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"x"}}, Output{Started: func(int) { <-release }})
		return err
	})
	fr, _ := fa.readOpen()
	for range maxQueuedControl + 2 {
		if fa.write(Frame{Type: FrameEvent, Stream: fr.Stream, Payload: []byte(`{"pid":1}`)}) != nil {
			break
		}
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the client queued events without bound")
	}
	close(release)
	wantBroken(t, c, wait(t, errc, 5*time.Second))
}

// TestHostileSilent: an agent that reads but never answers cannot hang a
// call past its context, or past the client's own timeout if the
// context has none; the connection stays usable.
func TestHostileSilent(t *testing.T) {
	c, fa := newHostile(t)
	go func() {
		for {
			fa.conn.SetReadDeadline(time.Time{})
			if _, err := ReadFrame(fa.conn, &fa.hdr); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := c.Stat(ctx, "/x")
	if !errors.Is(err, errdefs.DeadlineExceeded) {
		t.Errorf("Stat: err = %v, want DeadlineExceeded", err)
	}
	c.callTimeout = 200 * time.Millisecond
	_, err = c.Stat(context.Background(), "/x")
	if !errors.Is(err, errdefs.DeadlineExceeded) {
		t.Errorf("Stat without a deadline: err = %v, want DeadlineExceeded", err)
	}
	_, err = c.Write(context.Background(), "/x", strings.NewReader(strings.Repeat("x", 2*InitialWindow)), WriteOptions{})
	if !errors.Is(err, errdefs.DeadlineExceeded) {
		t.Errorf("Write to an agent that grants no credit: err = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	if c.Err() != nil {
		t.Errorf("a silent agent closed the connection: %v", c.Err())
	}
}

// TestHostileConnectionClosed: when the agent goes away every call in
// progress fails at once with agent_gone, and so do later ones.
func TestHostileConnectionClosed(t *testing.T) {
	c, fa := newHostile(t)
	var errs []chan error
	errs = append(errs, call(func() error { _, err := c.Wait(context.Background(), 1); return err }))
	errs = append(errs, call(func() error {
		_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"x"}, TimeoutS: 3600}, Output{})
		return err
	}))
	errs = append(errs, call(func() error {
		_, err := c.Write(context.Background(), "/f", strings.NewReader(strings.Repeat("x", 1<<20)), WriteOptions{})
		return err
	}))
	for range errs {
		fa.readOpen()
	}
	fa.conn.Close()
	for _, ch := range errs {
		err := wait(t, ch, 5*time.Second)
		if !errors.Is(err, errdefs.Unavailable) || errdefs.CodeOf(err) != "agent_gone" {
			t.Errorf("err = %v, want Unavailable agent_gone", err)
		}
	}
	if _, err := c.Stat(context.Background(), "/x"); errdefs.CodeOf(err) != "agent_gone" {
		t.Errorf("after the end: %v", err)
	}
}

// TestHostileFlood: an agent that sends output without end, within its
// windows, cannot make the client keep more than the request's cap.
func TestHostileFlood(t *testing.T) {
	c, fa := newHostile(t)
	const limit = 1 << 20
	const total = 256 << 20
	errc := make(chan error, 1)
	var res api.ExecResult
	go func() {
		var err error
		res, err = c.Exec(context.Background(), ExecRequest{Argv: []string{"x"}, MaxOutputBytes: limit}, Output{})
		errc <- err
	}()
	fr, _ := fa.readOpen()
	credit := int64(InitialWindow)
	chunk := []byte(strings.Repeat("flood", ChunkSize/5+1))[:ChunkSize]
	credits := make(chan int64, 1024)
	go func() {
		var hdr [HeaderSize]byte
		for {
			f, err := ReadFrame(fa.conn, &hdr)
			if err != nil {
				close(credits)
				return
			}
			if f.Type == FrameWindow {
				credits <- int64(binary.BigEndian.Uint32(f.Payload))
			}
		}
	}()
	var peak uint64
	for sent := 0; sent < total; {
		for credit < int64(len(chunk)) {
			// bounded: the hostile peer grants credit for every chunk it reads
			credit += <-credits
		}
		if err := fa.write(Frame{Type: FrameData, Channel: ChanOut + Channel(sent/ChunkSize%2), Stream: fr.Stream, Payload: chunk}); err != nil {
			t.Fatal(err)
		}
		credit -= int64(len(chunk))
		sent += len(chunk)
		if sent%(32<<20) == 0 {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		}
	}
	fa.reply(fr.Stream, api.ExecResult{ExitCode: 0})
	if err := wait(t, errc, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if len(res.Stdout) != limit || len(res.Stderr) != limit || !res.StdoutTruncated || !res.StderrTruncated {
		t.Errorf("flood: stdout %d stderr %d bytes, truncated %v %v", len(res.Stdout), len(res.Stderr), res.StdoutTruncated, res.StderrTruncated)
	}
	t.Logf("peak heap in use while %d MiB flowed: %.1f MiB", total>>20, float64(peak)/(1<<20))
	if peak > 64<<20 {
		t.Errorf("the client's heap reached %d MiB", peak>>20)
	}
}

func TestHostileListing(t *testing.T) {
	c, fa := newHostile(t)
	errc := call(func() error { _, err := c.List(context.Background(), "/", 1); return err })
	fr, _ := fa.readOpen()
	go func() {
		var hdr [HeaderSize]byte
		for {
			if _, err := ReadFrame(fa.conn, &hdr); err != nil {
				return
			}
		}
	}()
	// One entry past the limit, in small frames: no window is exceeded
	// if the client grants credit as it should.
	line := strings.Repeat("{}\n", 1000)
	for i := 0; i <= MaxListEntries/1000; i++ {
		if err := fa.write(Frame{Type: FrameData, Channel: ChanOut, Stream: fr.Stream, Payload: []byte(line)}); err != nil {
			break
		}
		time.Sleep(time.Millisecond) // let credit flow back
	}
	wantBroken(t, c, wait(t, errc, 10*time.Second))
}

func TestErrorsAndVersion(t *testing.T) {
	c, fa := newHostile(t)
	errc := call(func() error { _, err := c.Stat(context.Background(), "/x"); return err })
	fr, _ := fa.readOpen()
	payload, _ := json.Marshal(Reply{Error: &WireError{Class: "not_found", Code: "file_not_found", Message: "/x does not exist"}})
	fa.write(Frame{Type: FrameReply, Stream: fr.Stream, Payload: payload})
	err := wait(t, errc, 5*time.Second)
	if !errors.Is(err, errdefs.NotFound) || errdefs.CodeOf(err) != "file_not_found" || errdefs.MessageOf(err) != "/x does not exist" {
		t.Errorf("err = %v", err)
	}

	errc = call(func() error { return c.Remove(context.Background(), "/x", false) })
	fr, _ = fa.readOpen()
	payload, _ = json.Marshal(Reply{Error: &WireError{Class: "made_up", Code: "", Message: "m"}})
	fa.write(Frame{Type: FrameReply, Stream: fr.Stream, Payload: payload})
	if err := wait(t, errc, 5*time.Second); !errors.Is(err, errdefs.Internal) || errdefs.CodeOf(err) != "agent_error" {
		t.Errorf("unknown class: err = %v (%s)", err, errdefs.CodeOf(err))
	}

	// Frames for calls the client does not know are dropped.
	fa.write(Frame{Type: FrameReply, Stream: 12345, Payload: []byte("{}")})
	fa.write(Frame{Type: FrameData, Channel: ChanOut, Stream: 12345, Payload: []byte("x")})

	errc = call(func() error { _, err := c.Hello(context.Background()); return err })
	fr, _ = fa.readOpen()
	fa.reply(fr.Stream, Hello{Protocol: Protocol + 1})
	if err := wait(t, errc, 5*time.Second); !errors.Is(err, errdefs.Unsupported) {
		t.Errorf("protocol mismatch: err = %v", err)
	}
	if c.Err() != nil {
		t.Errorf("connection ended: %v", c.Err())
	}
}

// TestCancelReachesAgent: a cancelled call sends Cancel after its Open,
// even when the call was cancelled while its Open was still queued; a
// call cancelled before it started sends nothing.
func TestCancelReachesAgent(t *testing.T) {
	c, fa := newHostile(t)
	var errs []chan error
	for i := range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		errs = append(errs, call(func() error {
			_, err := c.Exec(ctx, ExecRequest{Argv: []string{fmt.Sprint(i)}}, Output{})
			return err
		}))
		if i%2 == 0 {
			cancel()
		} else {
			time.AfterFunc(time.Duration(i)*time.Millisecond, cancel)
		}
	}
	for _, ch := range errs {
		if err := wait(t, ch, 5*time.Second); !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want Canceled", err)
		}
	}
	// A last call marks the end of what the cancelled ones sent.
	end := call(func() error { _, err := c.Stat(context.Background(), "/end"); return err })
	opened := map[uint32]bool{}
	for {
		// Cancels may trail the last Open by a little: read until quiet.
		fa.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		f, err := ReadFrame(fa.conn, &fa.hdr)
		if err != nil {
			break
		}
		if f.Type == FrameOpen {
			var req Request
			json.Unmarshal(f.Payload, &req)
			if req.Op == OpStat {
				fa.reply(f.Stream, api.FileInfo{})
				continue
			}
			opened[f.Stream] = true
		}
		if f.Type == FrameCancel {
			if !opened[f.Stream] {
				t.Errorf("Cancel for call %d before (or without) its Open", f.Stream)
			}
			delete(opened, f.Stream)
		}
	}
	if len(opened) > 0 {
		t.Errorf("calls opened and never cancelled: %v", opened)
	}
	if err := wait(t, end, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}
