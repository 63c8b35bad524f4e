// Command dsec-wasmtools builds the function tier's default image into a
// directory: dsec-wasmtools OUTDIR creates OUTDIR/bin/<tool>.wasm.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/dsec-dev/dsec/internal/wasmtools"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dsec-wasmtools OUTDIR")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := wasmtools.Build(ctx, os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "dsec-wasmtools:", err)
		os.Exit(1)
	}
}
