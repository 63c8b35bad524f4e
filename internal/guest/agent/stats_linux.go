package agent

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/guest/agentproto"
	"github.com/dsec-dev/dsec/internal/sys"
)

// stats reports on the agent and its sandbox from /proc. It is
// informative: the node never trusts it.
func (a *agent) stats() agentproto.AgentStats {
	st := agentproto.AgentStats{
		AgentVersion: a.opt.Version,
		Pid:          os.Getpid(),
		UptimeS:      time.Since(a.started).Seconds(),
		Connections:  int(a.conns.Load()),
		Goroutines:   runtime.NumGoroutine(),
	}
	a.mu.Lock()
	st.Tracked = len(a.procs)
	for _, p := range a.procs {
		if p.background {
			st.Background++
		}
	}
	a.mu.Unlock()
	if entries, err := os.ReadDir("/proc"); err == nil {
		for _, e := range entries {
			if _, err := strconv.Atoi(e.Name()); err == nil {
				st.Processes++
			}
		}
	}
	st.AgentRSSBytes = procKiB("/proc/self/status", "VmRSS:")
	st.MemTotalBytes = procKiB("/proc/meminfo", "MemTotal:")
	st.MemAvailableBytes = procKiB("/proc/meminfo", "MemAvailable:")
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.current"); err == nil {
		st.CgroupMemoryBytes, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	if u, err := sys.StatFS("/"); err == nil {
		st.RootUsedBytes, st.RootSizeBytes, st.RootFull = u.Used, u.Size, u.Full()
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			st.Load1, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	return st
}

// procKiB returns the "key: N kB" value of a /proc file, in bytes.
func procKiB(file, key string) int64 {
	f, err := os.Open(file)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
			fields := strings.Fields(rest)
			if len(fields) > 0 {
				n, _ := strconv.ParseInt(fields[0], 10, 64)
				return n << 10
			}
		}
	}
	return 0
}
