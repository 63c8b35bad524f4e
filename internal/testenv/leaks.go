package testenv

import (
	"bufio"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Mounts returns the mount points at or below dir.
func Mounts(t testing.TB, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		t.Fatalf("reading mounts: %v", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 1 && (fields[1] == dir || strings.HasPrefix(fields[1], dir+"/")) {
			out = append(out, fields[1])
		}
	}
	return out
}

// NoMountsUnder fails the test if anything is mounted at or below dir.
func NoMountsUnder(t testing.TB, dir string) {
	t.Helper()
	if m := Mounts(t, dir); len(m) > 0 {
		t.Errorf("leftover mounts under %s: %q", dir, m)
	}
}

// Goroutines counts the goroutines of this process, leaving out those that
// live as long as the process once started (os/signal's loop).
func Goroutines() int {
	n, _ := goroutines()
	return n
}

func goroutines() (int, string) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.TrimSpace(g) != "" && !strings.Contains(g, "os/signal.signal_recv") {
			count++
		}
	}
	return count, string(buf)
}

// GoroutinesSettle waits up to 5 s for the goroutine count (as Goroutines
// counts) to drop back to at most base, and fails the test with a dump if
// it does not.
func GoroutinesSettle(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, dump := goroutines()
		if n <= base {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d goroutines remain (started with %d):\n%s", n, base, dump)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
