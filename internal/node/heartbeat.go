package node

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/api"
)

// Info describes the node now: tiers, capacity and usage.
func (a *Service) Info(ctx context.Context) api.Node {
	n := api.Node{
		ID:      a.opt.ID,
		Version: a.opt.Version,
		Ready:   true,
		Capacity: api.Capacity{
			CPUs:         runtime.NumCPU(),
			MemoryMB:     int(meminfo("MemTotal") / 1024),
			MaxSandboxes: a.opt.MaxSandboxes,
		},
		LastSeen:  time.Now().UTC(),
		StartedAt: a.started,
		Monitor:   a.opt.Monitor,
		Guard:     a.opt.Guard,
	}
	for _, rt := range a.opt.Registry.All() {
		n.Tiers = append(n.Tiers, rt.Fingerprint(ctx))
	}
	a.mu.Lock()
	n.Usage.Sandboxes = len(a.sandboxes)
	a.mu.Unlock()
	n.Usage.Load1 = load1()
	n.Usage.MemoryMB = int((meminfo("MemTotal") - meminfo("MemAvailable")) / 1024)
	return n
}

func (a *Service) heartbeat(ctx context.Context, hb heartbeatSink) {
	if hb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, a.opt.Heartbeat*2)
	defer cancel()
	if err := hb.PutNode(ctx, a.Info(ctx)); err != nil && ctx.Err() == nil {
		a.log.Warn("heartbeat", "err", err)
	}
}

func (a *Service) heartbeatLoop(ctx context.Context, hb heartbeatSink) {
	defer a.wg.Done()
	t := time.NewTicker(a.opt.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.heartbeat(ctx, hb)
		}
	}
}

// meminfo returns a /proc/meminfo field in KiB, or 0.
func meminfo(field string) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if ok && name == field {
			v, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return v
		}
	}
	return 0
}

func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
