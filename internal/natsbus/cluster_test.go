package natsbus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/internal/natsbus"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestClusterReplicates runs three embedded members: a bucket made with
// three replicas keeps its writes when one member goes, refuses writes
// without a majority, and serves again when the majority is back.
func TestClusterReplicates(t *testing.T) {
	c := testenv.NATSCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn := func(i int) jetstream.JetStream {
		nc, err := c.Members[i].Server.Connect("test")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	js0 := conn(0)
	kv, err := js0.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "t", Replicas: 3, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if n := natsbus.Replicas(ctx, js0, natsbus.KVStream("t"), 0); n != 3 {
		t.Fatalf("Replicas of an R3 bucket with no wish: %d, want 3", n)
	}
	if _, err := kv.Put(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}

	c.Stop(0)
	js2 := conn(2)
	kv2, err := js2.KeyValue(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	put := func(kv jetstream.KeyValue, k string) error {
		// The stream's leader may have been the stopped member: writes
		// wait for a new one, within seconds.
		deadline := time.Now().Add(30 * time.Second)
		for {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := kv.Put(pctx, k, []byte("v"))
			cancel()
			if err == nil || time.Now().After(deadline) {
				return err
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if err := put(kv2, "b"); err != nil {
		t.Fatalf("write with two of three members: %v", err)
	}
	if e, err := kv2.Get(ctx, "a"); err != nil || string(e.Value()) != "1" {
		t.Fatalf("a written before the stop: %v", err)
	}

	c.Stop(1)
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = kv2.Put(pctx, "c", []byte("v"))
	pcancel()
	if err == nil {
		t.Fatal("a write with one member of three succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
		t.Logf("write without quorum: %v", err)
	}

	c.Start(0)
	if err := put(kv2, "d"); err != nil {
		t.Fatalf("write after the majority came back: %v", err)
	}
	for _, k := range []string{"a", "b", "d"} {
		if _, err := kv2.Get(ctx, k); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
}

// TestClusterOptionsRefused: a member needs a token and a route address.
func TestClusterOptionsRefused(t *testing.T) {
	ctx := context.Background()
	for _, opt := range []natsbus.Options{
		{StoreDir: t.TempDir(), Token: "x", Cluster: natsbus.Cluster{Name: "c"}},
		{StoreDir: t.TempDir(), Cluster: natsbus.Cluster{Name: "c", Listen: "127.0.0.1:0"}},
		{StoreDir: t.TempDir(), Token: "x", Cluster: natsbus.Cluster{Name: "c", Listen: "127.0.0.1:0", Routes: []string{"nohost"}}},
	} {
		if srv, err := natsbus.Start(ctx, opt); err == nil {
			srv.Shutdown()
			t.Errorf("started with %+v", opt.Cluster)
		}
	}
}
