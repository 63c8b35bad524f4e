package container

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/dsec-dev/dsec/internal/agentproto"
)

// dialAgent connects to a sandbox's agent and checks it speaks the
// protocol.
func dialAgent(ctx context.Context, sock string, log *slog.Logger) (*agentproto.Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("connecting to the agent: %w", err)
	}
	c := agentproto.NewClient(conn, log)
	if _, err := c.Hello(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("greeting the agent: %w", err)
	}
	return c, nil
}
