package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"

	"github.com/dsec-dev/dsec/api"
)

// wsServer accepts a WebSocket, reads one ExecRequest and sends events.
func wsServer(t *testing.T, events []api.ExecEvent, closeAfter bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandboxes/sb-1/exec/ws" {
			writeJSON(w, http.StatusNotFound, api.Error{Code: "sandbox_not_found", Message: "no", Class: ClassNotFound})
			return
		}
		if got := r.Header.Get("Authorization"); got != "Bearer secret" {
			t.Errorf("Authorization = %q", got)
		}
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.CloseNow()
		_, msg, err := conn.Read(r.Context())
		if err != nil {
			t.Error(err)
			return
		}
		var req api.ExecRequest
		if err := json.Unmarshal(msg, &req); err != nil || req.Command != "echo hi" {
			t.Errorf("request %s: %v", msg, err)
		}
		for _, ev := range events {
			b, _ := json.Marshal(ev)
			if err := conn.Write(r.Context(), websocket.MessageText, b); err != nil {
				t.Error(err)
				return
			}
		}
		if closeAfter {
			_ = conn.Close(websocket.StatusNormalClosure, "")
		}
	}
}

func TestExecWS(t *testing.T) {
	exit := &api.ExecResult{ExitCode: 0, DurationMS: 1}
	events := []api.ExecEvent{
		{Type: api.EventStart, Pid: 1},
		{Type: api.EventStdout, Data: "hi\n"},
		{Type: api.EventExit, Result: exit},
	}
	c := newTestClient(t, wsServer(t, events, true))
	var got []api.ExecEvent
	res, err := c.ExecWS(context.Background(), "sb-1", api.ExecRequest{Command: "echo hi"}, collect(&got))
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

func TestExecWSTruncated(t *testing.T) {
	c := newTestClient(t, wsServer(t, []api.ExecEvent{{Type: api.EventStart}}, true))
	_, err := c.ExecWS(context.Background(), "sb-1", api.ExecRequest{Command: "echo hi"}, nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("ExecWS error = %v, want io.ErrUnexpectedEOF", err)
	}
}

func TestExecWSHandlerError(t *testing.T) {
	c := newTestClient(t, wsServer(t, []api.ExecEvent{{Type: api.EventStart}, {Type: api.EventStdout, Data: "x"}}, false))
	stop := errors.New("stop")
	_, err := c.ExecWS(context.Background(), "sb-1", api.ExecRequest{Command: "echo hi"}, func(ev api.ExecEvent) error {
		if ev.Type == api.EventStdout {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("ExecWS error = %v, want the handler's", err)
	}
}

func TestExecWSHTTPError(t *testing.T) {
	c := newTestClient(t, wsServer(t, nil, true))
	_, err := c.ExecWS(context.Background(), "nope", api.ExecRequest{Command: "echo hi"}, nil)
	var e *Error
	if !errors.As(err, &e) || e.Code != "sandbox_not_found" || e.StatusCode != http.StatusNotFound {
		t.Fatalf("ExecWS error = %v, want sandbox_not_found", err)
	}
}
