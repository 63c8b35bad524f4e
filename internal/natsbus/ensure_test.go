package natsbus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsec-dev/dsec/internal/natsbus"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// TestEnsureStream: a stream as wanted opens as it is, one that differs
// is updated to what is wanted, and a bucket likewise.
func TestEnsureStream(t *testing.T) {
	nc, _ := testenv.NATS(t)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: jetstream.FileStorage, MaxAge: time.Hour}
	s, err := natsbus.EnsureStream(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	created := s.CachedInfo().Created
	again, err := natsbus.EnsureStream(ctx, js, cfg)
	if err != nil || again.CachedInfo().Config.MaxAge != time.Hour || !again.CachedInfo().Created.Equal(created) {
		t.Fatalf("second ensure: %v", err)
	}
	cfg.MaxAge = 2 * time.Hour
	changed, err := natsbus.EnsureStream(ctx, js, cfg)
	if err != nil || changed.CachedInfo().Config.MaxAge != 2*time.Hour {
		t.Fatalf("ensure with a new max age: %+v, %v", changed.CachedInfo().Config.MaxAge, err)
	}

	kvc := jetstream.KeyValueConfig{Bucket: "b", History: 1, TTL: time.Minute, Description: "d"}
	if _, err := natsbus.EnsureKV(ctx, js, kvc); err != nil {
		t.Fatal(err)
	}
	kvc.TTL = 2 * time.Minute
	if _, err := natsbus.EnsureKV(ctx, js, kvc); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, natsbus.KVStream("b"))
	if err != nil || st.CachedInfo().Config.MaxAge != 2*time.Minute {
		t.Fatalf("bucket TTL after ensure with a new one: %v", err)
	}
}
