package noderpc

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testenv"
)

func TestErrorRoundTrip(t *testing.T) {
	for _, c := range errdefs.Classes {
		m := &nats.Msg{}
		EncodeError(m, errdefs.New(c, "some_code", "message for %s", c))
		err := DecodeError(m)
		if !errors.Is(err, c) || errdefs.CodeOf(err) != "some_code" || errdefs.MessageOf(err) != "message for "+string(c) {
			t.Errorf("class %s: decoded %v (%s)", c, err, errdefs.CodeOf(err))
		}
	}
	if DecodeError(&nats.Msg{Data: []byte("{}")}) != nil {
		t.Error("a plain reply decoded as an error")
	}
}

// TestErrorRetryAfterRoundTrip: a node's retry hint (an overloaded
// node's admission) reaches the control plane, which turns it into the
// API's Retry-After.
func TestErrorRetryAfterRoundTrip(t *testing.T) {
	m := &nats.Msg{}
	EncodeError(m, &errdefs.Error{Class: errdefs.RateLimited, Code: "overloaded", Msg: "busy", RetryAfter: 2500 * time.Millisecond})
	err := DecodeError(m)
	if got := errdefs.RetryAfterOf(err); got != 2500*time.Millisecond || !errors.Is(err, errdefs.RateLimited) {
		t.Errorf("decoded %v with retry hint %v, want rate_limited with 2.5s", err, got)
	}
	m = &nats.Msg{}
	EncodeError(m, errdefs.New(errdefs.Unavailable, "x", "no hint"))
	if got := errdefs.RetryAfterOf(DecodeError(m)); got != 0 {
		t.Errorf("an error without a hint decoded with %v", got)
	}
}

func TestValidNodeID(t *testing.T) {
	for id, ok := range map[string]bool{"node-1": true, "a_b": true, "": false, "a.b": false, "a*": false, "a>": false, "x y": false} {
		if ValidNodeID(id) != ok {
			t.Errorf("ValidNodeID(%q) = %v", id, !ok)
		}
	}
}

// TestExecReassemblesChunks serves a fake node that answers an exec with
// numbered chunks, and checks the client puts the output back together,
// streams it when asked, and refuses an out-of-order sequence.
func TestExecReassemblesChunks(t *testing.T) {
	nc, _ := testenv.NATS(t)
	reorder := false
	sub, err := nc.Subscribe(Subject("n1", OpExec), func(m *nats.Msg) {
		send := func(seq int, kind, data string) {
			m.RespondMsg(&nats.Msg{Header: nats.Header{HdrKind: {kind}, HdrSeq: {strconv.Itoa(seq)}}, Data: []byte(data)})
		}
		if reorder {
			send(2, api.EventStdout, "b")
			return
		}
		send(1, api.EventStdout, "hello ")
		send(2, api.EventStderr, "oops")
		send(3, api.EventStdout, "world")
		send(4, api.EventExit, `{"exit_code":3,"stdout":"!"}`)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	c := NewClient(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.Exec(ctx, "n1", "sb", api.ExecRequest{TimeoutS: 5}, nil)
	if err != nil || res.ExitCode != 3 || res.Stdout != "hello world!" || res.Stderr != "oops" {
		t.Fatalf("buffered exec = %+v, %v", res, err)
	}
	var out, errOut string
	res, err = c.Exec(ctx, "n1", "sb", api.ExecRequest{TimeoutS: 5}, &Output{
		Stdout: func(p []byte) { out += string(p) }, Stderr: func(p []byte) { errOut += string(p) }})
	if err != nil || out != "hello world" || errOut != "oops" || res.Stdout != "!" {
		t.Fatalf("streamed exec = %+v, %v; out %q err %q", res, err, out, errOut)
	}
	reorder = true
	if _, err := c.Exec(ctx, "n1", "sb", api.ExecRequest{TimeoutS: 5}, nil); errdefs.CodeOf(err) != "stream_broken" {
		t.Errorf("out-of-order reply: %v, want stream_broken", err)
	}
	if _, err := c.Exec(ctx, "nobody", "sb", api.ExecRequest{TimeoutS: 5}, nil); !errors.Is(err, errdefs.Unavailable) {
		t.Errorf("exec on a node nobody serves: %v, want Unavailable", err)
	}
}
