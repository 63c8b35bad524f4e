package client_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
)

func Example() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:7878", os.Getenv("DSEC_TOKEN"), client.WithRetry(3))
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, sb.ID)

	res, err := c.ExecStream(ctx, sb.ID, api.ExecRequest{Command: "make test"}, func(ev api.ExecEvent) error {
		switch ev.Type {
		case api.EventStdout:
			os.Stdout.WriteString(ev.Data)
		case api.EventStderr:
			os.Stderr.WriteString(ev.Data)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", res.ExitCode)
}
