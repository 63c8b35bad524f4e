//go:build linux

package agent_test

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// BenchmarkExecRoundTrip measures a minimal exec (/bin/true) from Client
// to an agent in this process and back, over a Unix socket: fork, exec,
// wait and the protocol. It reports the median and 99th percentile.
func BenchmarkExecRoundTrip(b *testing.B) {
	c, _ := newAgent(b, agent.Options{})
	req := agentproto.ExecRequest{Argv: []string{"/bin/true"}, TimeoutS: 10}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		res, err := c.Exec(ctx, req, agentproto.Output{})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v, %v", res, err)
		}
		lat = append(lat, time.Since(start))
	}
	reportLatency(b, lat)
}

// BenchmarkExecRoundTripPID1 is BenchmarkExecRoundTrip against an agent
// in its own process, PID 1 of a new pid namespace: the production path
// (reap-all mode, a small process).
func BenchmarkExecRoundTripPID1(b *testing.B) {
	ca := startChildAgent(b)
	c := dial(b, ca.socket)
	defer c.Close()
	req := agentproto.ExecRequest{Argv: []string{"/bin/true"}, TimeoutS: 10}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		start := time.Now()
		res, err := c.Exec(ctx, req, agentproto.Output{})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v, %v", res, err)
		}
		lat = append(lat, time.Since(start))
	}
	reportLatency(b, lat)
	b.StopTimer()
	if err := ca.stop(); err != nil {
		b.Error(err)
	}
}

// BenchmarkHelloRoundTrip measures the protocol alone: one small call.
func BenchmarkHelloRoundTrip(b *testing.B) {
	c, _ := newAgent(b, agent.Options{})
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		start := time.Now()
		if _, err := c.Hello(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	reportLatency(b, lat)
}

func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// BenchmarkIdleRSS builds dsec-guest as the Makefile does, runs `serve`,
// says hello, lets it settle and reports its resident memory: VmRSS,
// RssAnon (private) and Pss (with the binary's pages shared between
// sandboxes counted once per sharer). It measures, it does not loop.
func BenchmarkIdleRSS(b *testing.B) {
	dir := socketDir(b)
	bin := filepath.Join(dir, "dsec-guest")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "github.com/dsec-dev/dsec/cmd/dsec-guest")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Skipf("building dsec-guest: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "agent.sock")
	cmd := exec.Command(bin, "serve", "--socket", sock, "--root", b.TempDir(), "--any-peer")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		_ = testenv.WaitCmd(b, cmd, time.Minute, "the agent to exit after SIGKILL")
	}()
	deadline := time.Now().Add(10 * time.Second)
	var conn net.Conn
	for {
		var err error
		if conn, err = net.Dial("unix", sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	c := agentproto.NewClient(conn, nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Hello(ctx); err != nil {
		b.Fatal(err)
	}
	// One exec and one file call, then idle.
	if _, err := c.Exec(ctx, agentproto.ExecRequest{Argv: []string{"true"}}, agentproto.Output{}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.Stat(ctx, "/"); err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Second)
	for b.Loop() {
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	status := procFields(b, "/proc/"+pid+"/status")
	rollup := procFields(b, "/proc/"+pid+"/smaps_rollup")
	b.ReportMetric(status["VmRSS"], "VmRSS-KiB")
	b.ReportMetric(status["RssAnon"], "RssAnon-KiB")
	b.ReportMetric(status["RssFile"], "RssFile-KiB")
	b.ReportMetric(rollup["Pss"], "Pss-KiB")
	if fi, err := os.Stat(bin); err == nil {
		b.ReportMetric(float64(fi.Size())/1024, "binary-KiB")
	}
}

// procFields reads the "Key: N kB" lines of a /proc file.
func procFields(b *testing.B, file string) map[string]float64 {
	f, err := os.Open(file)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 2 && fields[1] == "kB" {
			n, _ := strconv.ParseFloat(fields[0], 64)
			out[k] = n
		}
	}
	return out
}
