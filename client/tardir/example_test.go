package tardir_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/client/tardir"
)

// Build a workspace layer from a local directory, compose an image with a
// toolkit layer, and read a file of the layer in a function sandbox.
func Example() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:7878", os.Getenv("DSEC_TOKEN"))
	if err != nil {
		log.Fatal(err)
	}
	tar := tardir.Open("./workspace") // packed while it is uploaded
	defer tar.Close()
	ws, err := c.ImportLayer(ctx, client.KindTar, tar, "team/ws:1")
	if err != nil {
		log.Fatal(err)
	}
	img, err := c.CreateImage(ctx, api.CreateImageRequest{
		Name: "team/fn:1", Workspace: ws.ID, Toolkit: "toolkit/wasm-tools:0123456789ab",
		Tiers: []string{api.TierFunction},
	})
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierFunction, Image: img.Name})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, sb.ID)
	res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"cat", "/README"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
}
