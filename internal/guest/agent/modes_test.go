//go:build linux

package agent_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
)

// runMode runs the test binary as a child in one of these modes:
//
//	serve  the agent on DSEC_AGENT_TEST_SOCKET (root DSEC_AGENT_TEST_ROOT)
//	       with the default peer check, as PID 1 or a child subreaper,
//	       until its stdin ends
//	probe  a client that connects to DSEC_AGENT_TEST_SOCKET, says hello and
//	       prints "accepted" or "refused: …"
func runMode(mode string) int {
	socket := os.Getenv("DSEC_AGENT_TEST_SOCKET")
	switch mode {
	case "serve":
		ln, err := net.Listen("unix", socket)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		go func() {
			io.Copy(io.Discard, os.Stdin)
			stop()
		}()
		err = agent.Run(ctx, agent.Options{
			Listener:  ln,
			Version:   "test-child",
			Root:      os.Getenv("DSEC_AGENT_TEST_ROOT"),
			Subreaper: true,
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "probe":
		conn, err := net.Dial("unix", socket)
		if err != nil {
			fmt.Printf("refused: dial: %v\n", err)
			return 0
		}
		c := agentproto.NewClient(conn, nil)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := c.Hello(ctx); err != nil {
			fmt.Printf("refused: %v\n", err)
			return 0
		}
		fmt.Println("accepted")
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown mode %q\n", mode)
	return 2
}
