package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// streamEvents serves events as NDJSON, flushing each line.
func streamEvents(t *testing.T, w http.ResponseWriter, events ...api.ExecEvent) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	for _, ev := range events {
		if err := enc.Encode(ev); err != nil {
			t.Error(err)
			return
		}
		_ = http.NewResponseController(w).Flush()
	}
}

func collect(got *[]api.ExecEvent) func(api.ExecEvent) error {
	return func(ev api.ExecEvent) error {
		*got = append(*got, ev)
		return nil
	}
}

func TestExec(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/sandboxes/sb-1/exec" {
			t.Errorf("request %s %s", r.Method, r.URL.Path)
		}
		var req api.ExecRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Error(err)
		}
		if diff := cmp.Diff(api.ExecRequest{Cmd: []string{"false"}}, req); diff != "" {
			t.Errorf("request mismatch (-want +got):\n%s", diff)
		}
		writeJSON(w, http.StatusOK, api.ExecResult{ExitCode: 1, Stderr: "no"})
	})
	res, err := c.Exec(context.Background(), "sb-1", api.ExecRequest{Cmd: []string{"false"}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&api.ExecResult{ExitCode: 1, Stderr: "no"}, res); diff != "" {
		t.Errorf("result mismatch (-want +got):\n%s", diff)
	}
}

func TestExecStream(t *testing.T) {
	long := strings.Repeat("x", 100<<10) // longer than the line buffer
	exit := &api.ExecResult{ExitCode: 3, DurationMS: 12}
	events := []api.ExecEvent{
		{Type: api.EventStart, Pid: 7},
		{Type: api.EventStdout, Data: "hello\n"},
		{Type: api.EventStderr, Data: "oops\n"},
		{Type: api.EventStdout, Data: long},
		{Type: api.EventExit, Result: exit},
	}
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandboxes/sb-1/exec/stream" || r.Header.Get("Accept") != "application/x-ndjson" {
			t.Errorf("request %s, Accept %q", r.URL.Path, r.Header.Get("Accept"))
		}
		streamEvents(t, w, events...)
	})
	var got []api.ExecEvent
	res, err := c.ExecStream(context.Background(), "sb-1", api.ExecRequest{Command: "run"}, collect(&got))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(events, got); diff != "" {
		t.Errorf("events mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(exit, res); diff != "" {
		t.Errorf("result mismatch (-want +got):\n%s", diff)
	}
}

func TestExecStreamHandlerErrorStops(t *testing.T) {
	gone := make(chan struct{})
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		defer close(gone)
		streamEvents(t, w, api.ExecEvent{Type: api.EventStart}, api.ExecEvent{Type: api.EventStdout, Data: "a"})
		select { // the command goes on until the client hangs up
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
			t.Error("client did not hang up")
		}
	})
	stop := errors.New("stop")
	var n int
	_, err := c.ExecStream(context.Background(), "sb-1", api.ExecRequest{Command: "yes"}, func(ev api.ExecEvent) error {
		n++
		if ev.Type == api.EventStdout {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("ExecStream error = %v, want the handler's", err)
	}
	if n != 2 {
		t.Errorf("handler saw %d events, want 2", n)
	}
	testenv.Recv(t, gone, time.Minute, "the handler to return")
}

func TestExecStreamTruncated(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		streamEvents(t, w, api.ExecEvent{Type: api.EventStart}, api.ExecEvent{Type: api.EventStdout, Data: "a"})
	})
	_, err := c.ExecStream(context.Background(), "sb-1", api.ExecRequest{Command: "x"}, nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("ExecStream error = %v, want io.ErrUnexpectedEOF", err)
	}
}

func TestExecStreamErrorEvent(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		streamEvents(t, w, api.ExecEvent{Type: api.EventError, Error: &api.Error{Code: "sandbox_gone", Message: "sandbox went away", Class: ClassNotFound}})
	})
	_, err := c.ExecStream(context.Background(), "sb-1", api.ExecRequest{Command: "x"}, nil)
	var e *Error
	if !errors.As(err, &e) || e.Code != "sandbox_gone" || !IsNotFound(err) {
		t.Fatalf("ExecStream error = %#v, want sandbox_gone of class not_found", err)
	}
}

func TestExecStreamHTTPError(t *testing.T) {
	c := newTestClient(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, api.Error{Code: "sandbox_not_found", Message: "no", Class: ClassNotFound})
	})
	_, err := c.ExecStream(context.Background(), "sb-1", api.ExecRequest{Command: "x"}, nil)
	if !IsNotFound(err) {
		t.Fatalf("ExecStream error = %v, want not found", err)
	}
}

func TestReadNDJSONBadLine(t *testing.T) {
	_, err := readNDJSON(bufio.NewReader(strings.NewReader("{\"type\":\"start\"}\nnot json\n")), nil)
	if err == nil || !strings.Contains(err.Error(), "decoding command event") {
		t.Fatalf("readNDJSON error = %v, want a decoding error", err)
	}
}

func TestReadNDJSONLineCutShort(t *testing.T) {
	_, err := readNDJSON(bufio.NewReader(strings.NewReader("{\"type\":\"start\"}\n{\"type\":\"std")), nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("readNDJSON error = %v, want io.ErrUnexpectedEOF", err)
	}
}

func TestReadNDJSONLastLineWithoutNewline(t *testing.T) {
	res, err := readNDJSON(bufio.NewReader(strings.NewReader("\n{\"type\":\"exit\",\"result\":{\"exit_code\":0}}")), nil)
	if err != nil || res == nil {
		t.Fatalf("readNDJSON = %v, %v; want the exit result", res, err)
	}
}

// FuzzReadNDJSON feeds the stream parser arbitrary server output: it must
// return a result or an error, never panic or hang.
func FuzzReadNDJSON(f *testing.F) {
	f.Add("{\"type\":\"start\"}\n{\"type\":\"stdout\",\"data\":\"x\"}\n{\"type\":\"exit\",\"result\":{\"exit_code\":0}}\n")
	f.Add("{\"type\":\"error\",\"error\":{\"code\":\"c\",\"message\":\"m\"}}")
	f.Add("{\"type\":\"exit\"}\n")
	f.Add("\n\n{")
	f.Fuzz(func(t *testing.T, s string) {
		res, err := readNDJSON(bufio.NewReader(strings.NewReader(s)), func(api.ExecEvent) error { return nil })
		if (res == nil) == (err == nil) {
			t.Fatalf("readNDJSON = %v, %v; want exactly one of them", res, err)
		}
	})
}
