// Package testenv holds helpers shared by DSec's tests: an embedded NATS
// server per test, and checks that a test left nothing behind on the host.
package testenv

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/dsec-dev/dsec/internal/natsbus"
)

// NATS starts an embedded JetStream server in a temporary directory and
// returns an in-process connection; both are closed when the test ends.
func NATS(t testing.TB) (*nats.Conn, *natsbus.Server) {
	t.Helper()
	srv, err := natsbus.Start(context.Background(), natsbus.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatalf("starting NATS: %v", err)
	}
	nc, err := srv.Connect("test")
	if err != nil {
		srv.Shutdown()
		t.Fatalf("connecting to NATS: %v", err)
	}
	t.Cleanup(func() {
		nc.Close()
		srv.Shutdown()
	})
	return nc, srv
}
