package agentsandbox

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/dsec-dev/dsec/internal/guest/agentproto"
)

// Dial connects to the agent behind the Unix socket sock (a container's
// socket, or QEMU's end of a VM's port) and waits for its hello, which
// checks that it speaks the protocol: the connection is the sandbox's
// readiness check. connected, if set, is called once the socket has
// accepted the connection (a boot's timing).
func Dial(ctx context.Context, sock string, log *slog.Logger, connected func()) (*agentproto.Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("connecting to the agent: %w", err)
	}
	if connected != nil {
		connected()
	}
	c := agentproto.NewClient(conn, log)
	if _, err := c.Hello(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("greeting the agent: %w", err)
	}
	return c, nil
}
