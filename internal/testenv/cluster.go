package testenv

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/natsbus"
)

// Cluster is a NATS cluster of embedded servers on loopback, each with
// its own store directory, that a test can stop and start member by
// member.
type Cluster struct {
	t       testing.TB
	Token   string
	Members []*Member
}

// Member is one server of a Cluster.
type Member struct {
	Opt    natsbus.Options
	Server *natsbus.Server // nil while stopped
}

// NATSCluster starts n members named n1…nN that route to each other; it
// returns once every member serves JetStream. They stop when the test
// ends.
func NATSCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t, Token: "cluster-test-token"}
	routes := make([]string, n)
	clients := make([]string, n)
	for i := range n {
		routes[i] = FreeAddr(t)
		clients[i] = FreeAddr(t)
	}
	dir := t.TempDir()
	for i := range n {
		c.Members = append(c.Members, &Member{Opt: natsbus.Options{
			Name: fmt.Sprintf("n%d", i+1), StoreDir: filepath.Join(dir, fmt.Sprint(i+1)),
			Listen: clients[i], Token: c.Token,
			Cluster: natsbus.Cluster{Name: "test", Listen: routes[i], Routes: routes},
		}})
	}
	t.Cleanup(func() {
		for i := range c.Members {
			c.Stop(i)
		}
	})
	// Members start at once: JetStream serves only once a majority is up.
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- c.start(i) }()
	}
	for range n {
		if err := Recv(t, errs, time.Minute, "a cluster member to start"); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		c.WaitJetStream(i)
	}
	return c
}

func (c *Cluster) start(i int) error {
	m := c.Members[i]
	srv, err := natsbus.Start(context.Background(), m.Opt)
	if err != nil {
		return fmt.Errorf("starting member %s: %w", m.Opt.Name, err)
	}
	m.Server = srv
	return nil
}

// Start restarts a stopped member and waits until it serves JetStream.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	if err := c.start(i); err != nil {
		c.t.Fatal(err)
	}
	c.WaitJetStream(i)
}

// Stop shuts member i down (its store stays for a restart).
func (c *Cluster) Stop(i int) {
	if m := c.Members[i]; m.Server != nil {
		m.Server.Shutdown()
		m.Server = nil
	}
}

// WaitJetStream waits until member i's JetStream answers.
func (c *Cluster) WaitJetStream(i int) {
	c.t.Helper()
	nc, err := c.Members[i].Server.Connect("wait")
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := natsbus.WaitJetStream(ctx, nc, nil); err != nil {
		c.t.Fatalf("member %s: %v", c.Members[i].Opt.Name, err)
	}
}

// URLs is the members' client URLs, comma-separated (as nodes dial them).
func (c *Cluster) URLs() string {
	var s string
	for i, m := range c.Members {
		if i > 0 {
			s += ","
		}
		s += "nats://" + m.Opt.Listen
	}
	return s
}

// FreeAddr returns a loopback host:port that was free a moment ago (for
// addresses that others must know before the listener starts).
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
