package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/coder/websocket"

	"github.com/dsec-dev/dsec/api"
)

// ExecWS is ExecStream over a WebSocket: it sends req as one text message
// and reads one event per message until exit or error.
func (c *Client) ExecWS(ctx context.Context, id string, req api.ExecRequest, fn func(api.ExecEvent) error) (*api.ExecResult, error) {
	p, err := sandboxPath(id, "/exec/ws")
	if err != nil {
		return nil, err
	}
	msg, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encoding request: %w", err)
	}
	ctx, cancel := c.withTimeout(ctx, commandTime(req.TimeoutS))
	defer cancel()
	h := make(http.Header, 2)
	if c.auth != nil {
		h["Authorization"] = c.auth
	}
	if c.agent != nil {
		h["User-Agent"] = c.agent
	}
	conn, resp, err := websocket.Dial(ctx, c.BaseURL()+p, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			body, _ := io.ReadAll(resp.Body)
			return nil, newError(resp.StatusCode, resp.Header, body)
		}
		return nil, fmt.Errorf("opening command websocket: %w", err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxEventSize)
	if err := conn.Write(ctx, websocket.MessageText, msg); err != nil {
		return nil, fmt.Errorf("sending command: %w", err)
	}
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != -1 || errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("%w: %w", errNoExit, io.ErrUnexpectedEOF)
			}
			return nil, fmt.Errorf("reading command stream: %w", err)
		}
		var ev api.ExecEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			return nil, fmt.Errorf("decoding command event: %w", err)
		}
		if res, done, herr := handleEvent(&ev, fn); done || herr != nil {
			if ev.Type == api.EventExit || ev.Type == api.EventError {
				_ = conn.Close(websocket.StatusNormalClosure, "")
			}
			return res, herr
		}
	}
}
