package container

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/sys"
	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The baselines: `crun run` and `runc run` (Debian's crun 1.8.1 and runc
// 1.1.5; scripts/deps.sh bench installs them) of an OCI bundle whose root
// is the same busybox layer, id-mapped and under an overlay with a tmpfs
// upper, exactly as a DSec sandbox's (made once: the OCI runtimes do not
// build roots). `run` creates the container, runs its process as PID 1,
// waits and deletes it; its config is what DSec does, as far as each
// runtime goes (see ociConfig).

// ociRuntime is crun or runc, driven through its command line.
type ociRuntime struct {
	name, bin string
	root      string // --root: its state directory
	// bare: the bundle without a seccomp filter (ociBundle.bare).
	bare bool
}

// ociBundle is a bundle directory over a sandbox-like root, and bare the
// same without a seccomp filter.
type ociBundle struct {
	dir, bare string
}

// newOCIBundle makes a bundle whose root is the busybox layer of the test
// image under an overlay, as DSec roots are, released at the end.
func newOCIBundle(b *testing.B, rt *testRuntime, dir string) ociBundle {
	b.Helper()
	ctx := context.Background()
	bdir := filepath.Join(dir, "oci")
	upper := filepath.Join(bdir, "upper")
	if err := os.MkdirAll(upper, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := sys.MountTmpfs("dsec-upper", upper, fmt.Sprintf("size=64m,mode=0755,uid=%d,gid=%d", DefaultIDBase, DefaultIDBase)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sys.Unmount(upper) })
	root, release, err := rt.layers.Root(ctx, "ocibundle", world.bare, upper)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(release)
	bundle := ociBundle{dir: bdir, bare: filepath.Join(dir, "oci-bare")}
	for _, d := range []string{bundle.dir, bundle.bare} {
		cfg, err := json.MarshalIndent(ociConfig(b, root, DefaultIDBase, 65536, d == bundle.dir), "", " ")
		if err == nil {
			err = os.MkdirAll(d, 0o700)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(d, "config.json"), cfg, 0o600)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	return bundle
}

// ociConfig is the bundle's config: `crun spec`'s defaults (capabilities,
// mounts, masked and read-only paths, no_new_privs, RLIMIT_NOFILE) with
// what DSec sandboxes have that the OCI runtimes can do: user namespace
// root mapped to the same host ids; pid, network (with no devices: lo
// only), ipc, uts, mount and cgroup namespaces; memory and pids limits;
// `/bin/true` as the process; with filter, Docker's default seccomp
// profile for those capabilities, what Docker gives crun or runc (and
// what DSec's filter is built from: DSec's is stricter).
func ociConfig(b testing.TB, rootfs string, hostID, count int, filter bool) map[string]any {
	caps := []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}
	idmap := []map[string]int{{"containerID": 0, "hostID": hostID, "size": count}}
	ns := []map[string]string{}
	for _, t := range []string{"pid", "network", "ipc", "uts", "mount", "user", "cgroup"} {
		ns = append(ns, map[string]string{"type": t})
	}
	linux := map[string]any{
		"uidMappings": idmap,
		"gidMappings": idmap,
		"resources": map[string]any{
			"memory": map[string]int64{"limit": 256 << 20},
			"pids":   map[string]int64{"limit": 512},
		},
		"namespaces": ns,
		"maskedPaths": []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
			"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
		"readonlyPaths": []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
	}
	if filter {
		prof, err := mobyseccomp.GetDefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}})
		if err != nil {
			b.Fatal(err)
		}
		linux["seccomp"] = prof
	}
	return map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"terminal":        false,
			"user":            map[string]int{"uid": 0, "gid": 0},
			"args":            []string{"/bin/true"},
			"env":             []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"cwd":             "/",
			"capabilities":    map[string][]string{"bounding": caps, "effective": caps, "permitted": caps},
			"rlimits":         []map[string]any{{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}},
			"noNewPrivileges": true,
		},
		"root":     map[string]any{"path": rootfs, "readonly": false},
		"hostname": "bench",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": []string{"nosuid", "noexec", "nodev"}},
			{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		"linux": linux,
	}
}

// lookOCI returns the OCI runtimes found on the host, with their state
// under dir.
func lookOCI(dir string) (found []ociRuntime, missing []string) {
	for _, name := range []string{"crun", "runc"} {
		bin, err := exec.LookPath(name)
		if err != nil {
			missing = append(missing, name)
			continue
		}
		found = append(found, ociRuntime{name: name, bin: bin, root: filepath.Join(dir, name+"-state")})
		if name == "crun" {
			found = append(found, ociRuntime{name: "crun-nofilter", bin: bin, root: filepath.Join(dir, name+"-nofilter-state"), bare: true})
		}
	}
	return found, missing
}

// run is `<runtime> run --bundle <bundle> <id>` from start to exit.
func (o ociRuntime) run(bundle ociBundle, id string, log *os.File) (time.Duration, error) {
	dir := bundle.dir
	if o.bare {
		dir = bundle.bare
	}
	cmd := exec.Command(o.bin, "--root", o.root, "run", "--bundle", dir, id)
	cmd.Stdout, cmd.Stderr = log, log
	t := time.Now()
	err := cmd.Run()
	el := time.Since(t)
	if err != nil {
		return el, fmt.Errorf("%s run %s: %w: %s", o.name, id, err, tail(log))
	}
	return el, nil
}

func tail(f *os.File) string {
	b, _ := os.ReadFile(f.Name())
	if len(b) > 1024 {
		b = b[len(b)-1024:]
	}
	return strings.TrimSpace(string(b))
}

// unifiedControllers is what crun reads to refuse a hybrid host.
const unifiedControllers = "/sys/fs/cgroup/unified/cgroup.controllers"

// hybridCgroups reports whether the host's unified hierarchy has
// controllers while v1 ones are mounted, which crun 1.8 refuses ("cgroups
// in hybrid mode not supported, drop all controllers from cgroupv2"):
// here the unified hierarchy shows hugetlb, which no v1 hierarchy holds.
func hybridCgroups() bool {
	b, err := os.ReadFile(unifiedControllers)
	return err == nil && len(bytes.TrimSpace(b)) > 0
}

// onOCIThread runs fn on a goroutine locked to an OS thread that the OCI
// runtimes are started from. On a hybrid host that thread has a mount
// namespace of its own in which unifiedControllers reads empty, so crun
// accepts the host and uses the v1 hierarchies as it would with no
// controller in the unified one; nothing outside the thread changes
// (mounting a v1 hugetlb hierarchy instead would change the whole host).
// The thread is never unlocked: it dies with the goroutine. It is never
// the main thread, whose namespaces are the process's (/proc/self): a
// goroutine that lands there keeps it locked and hands the work on, so
// that the next one cannot.
func onOCIThread(dir string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if syscall.Gettid() == os.Getpid() {
			errc <- onOCIThread(dir, fn)
			runtime.UnlockOSThread()
			return
		}
		if hybridCgroups() {
			empty := filepath.Join(dir, "empty-controllers")
			if err := os.WriteFile(empty, nil, 0o644); err != nil {
				errc <- err
				return
			}
			if err := syscall.Unshare(syscall.CLONE_NEWNS); err != nil {
				errc <- fmt.Errorf("unsharing the mount namespace: %w", err)
				return
			}
			if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
				errc <- err
				return
			}
			if err := syscall.Mount(empty, unifiedControllers, "", syscall.MS_BIND, ""); err != nil {
				errc <- fmt.Errorf("masking %s: %w", unifiedControllers, err)
				return
			}
		}
		errc <- fn()
	}()
	// bounded: fn is the runtime's exec with its own timeout
	return <-errc
}

// ociLeftovers lists the cgroups and state the OCI runtimes left for ids
// starting with prefix.
func ociLeftovers(rts []ociRuntime, prefix string) []string {
	var out []string
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", prefix+"*"))
	out = append(out, dirs...)
	for _, o := range rts {
		ents, _ := os.ReadDir(o.root)
		for _, e := range ents {
			if e.IsDir() {
				out = append(out, filepath.Join(o.root, e.Name()))
			}
		}
	}
	return out
}

// BenchmarkVsOCI measures DSec's cycle (create → `true` through the agent
// → destroy) and `crun run` / `runc run` of the same root with `true` as
// PID 1, one at a time (seq) and from 8 goroutines (par8). crun and runc
// run with Docker's default seccomp profile, as DSec's sandboxes run with
// a filter built from it; crun-nofilter is crun without any filter. Each
// b.N is a round of a block of each, in rotating order, so that all see
// the same machine (it is shared and noisy). It prints a table and reports
// p50s, p99s, rates and the ratios of the OCI runtimes' p50 to DSec's
// full cycle. Run it with -benchtime Nx, N ≥ 2 rounds (the table is not
// printed for the framework's first, 1-round probe).
func BenchmarkVsOCI(b *testing.B) {
	for _, conc := range []int{1, 8} {
		b.Run(concName(conc), func(b *testing.B) { benchVsOCI(b, conc) })
	}
}

type ociResult struct {
	name    string
	ready   []time.Duration // DSec only
	total   []time.Duration
	wall    time.Duration
	samples int
}

func benchVsOCI(b *testing.B, conc int) {
	dir := b.TempDir()
	b.Cleanup(func() { checkHost(b, dir) })
	// dsec: sandboxes without network access, each in a namespace of its
	// own with lo alone, as the OCI bundle's, with the warm pool `dsec up`
	// keeps by default (2); dsec-cold: the same without a warm pool.
	// dsec-net: with a network of the node's (veth pair, routes,
	// nftables: never warm); dsec-net-reuse: the same with namespaces
	// reused (network.Options.Reuse).
	rt := newRuntime(b, dir, runtimeOptions{pool: 32, warm: 2})
	coldDir, netDir, reuseDir := b.TempDir(), b.TempDir(), b.TempDir()
	b.Cleanup(func() { checkHost(b, coldDir); checkHost(b, netDir); checkHost(b, reuseDir) })
	rtCold := newRuntime(b, coldDir, runtimeOptions{pool: 32})
	rtNet := newRuntime(b, netDir, runtimeOptions{pool: 32})
	rtNet.benchNet = benchLinked
	rtReuse := newRuntime(b, reuseDir, runtimeOptions{pool: 32, reuse: true})
	rtReuse.benchNet = benchLinked
	ocis, missing := lookOCI(dir)
	if len(missing) > 0 {
		b.Logf("not installed (scripts/deps.sh bench): %s", strings.Join(missing, ", "))
	}
	bundle := newOCIBundle(b, rt, dir)
	prefix := fmt.Sprintf("dsecbench-%d-", os.Getpid())
	b.Cleanup(func() {
		if left := ociLeftovers(ocis, prefix); len(left) > 0 {
			b.Errorf("left by the OCI runtimes: %q", left)
		}
	})
	ctx := context.Background()
	block := 16 * conc // cycles per runtime per round

	results := []*ociResult{{name: "dsec"}, {name: "dsec-cold"}, {name: "dsec-net"}, {name: "dsec-net-reuse"}}
	for _, o := range ocis {
		results = append(results, &ociResult{name: o.name})
	}
	var seq atomic.Int64 // names DSec's sandboxes
	runBlock := func(r *ociResult, n int, record bool) error {
		if strings.HasPrefix(r.name, "dsec") {
			on := map[string]*testRuntime{"dsec": rt, "dsec-cold": rtCold, "dsec-net": rtNet, "dsec-net-reuse": rtReuse}[r.name]
			ss, wall, err := parallel(n, conc, func(int) (cycleSample, error) {
				return cycleOnce(ctx, on, fmt.Sprintf("v%d", seq.Add(1)))
			})
			if err != nil {
				return err
			}
			if record {
				r.ready = append(r.ready, field(ss, func(s cycleSample) time.Duration { return s.ready })...)
				r.total = append(r.total, field(ss, func(s cycleSample) time.Duration { return s.total })...)
				r.wall += wall
				r.samples += len(ss)
			}
			return nil
		}
		var o ociRuntime
		for _, x := range ocis {
			if x.name == r.name {
				o = x
			}
		}
		// Each worker starts its runtime from its own prepared thread.
		ss, wall, err := parallel(conc, conc, func(w int) ([]time.Duration, error) {
			var lat []time.Duration
			err := onOCIThread(dir, func() error {
				log, err := os.CreateTemp(dir, o.name+"-log-*")
				if err != nil {
					return err
				}
				defer log.Close()
				for i := w; i < n; i += conc {
					el, err := o.run(bundle, fmt.Sprintf("%s%s-%d", prefix, o.name, seq.Add(1)), log)
					if err != nil {
						return err
					}
					lat = append(lat, el)
				}
				return nil
			})
			return lat, err
		})
		if err != nil {
			return err
		}
		if record {
			for _, s := range ss {
				r.total = append(r.total, s...)
				r.samples += len(s)
			}
			r.wall += wall
		}
		return nil
	}
	// Warm-up: first runs pay for page faults and the pool's first fill.
	for _, r := range results {
		if err := runBlock(r, 2*conc, false); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range results {
			if err := runBlock(results[(i+j)%len(results)], block, true); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	reportVsOCI(b, conc, results)
}

func reportVsOCI(b *testing.B, conc int, results []*ociResult) {
	dsec := pct(results[0].total, 50)
	rows := [][]string{{"runtime", "mode", "n", "ready p50", "ready p99", "cycle p50", "cycle p99", "sandboxes/s", "p50 / dsec cycle"}}
	for _, r := range results {
		rate := float64(r.samples) / r.wall.Seconds()
		p50, p99 := pct(r.total, 50), pct(r.total, 99)
		ready50, ready99 := "-", "-"
		if r.ready != nil {
			ready50, ready99 = fmt.Sprintf("%.2f", pct(r.ready, 50)), fmt.Sprintf("%.2f", pct(r.ready, 99))
			b.ReportMetric(pct(r.ready, 50), r.name+"-ready-p50-ms")
			b.ReportMetric(pct(r.ready, 99), r.name+"-ready-p99-ms")
		} else {
			b.ReportMetric(p50/dsec, r.name+"/dsec-x")
		}
		b.ReportMetric(p50, r.name+"-p50-ms")
		b.ReportMetric(p99, r.name+"-p99-ms")
		b.ReportMetric(rate, r.name+"-sandboxes/s")
		rows = append(rows, []string{r.name, concName(conc), fmt.Sprint(r.samples), ready50, ready99,
			fmt.Sprintf("%.2f", p50), fmt.Sprintf("%.2f", p99), fmt.Sprintf("%.0f", rate), fmt.Sprintf("%.2f×", p50/dsec)})
	}
	if b.N == 1 {
		return // the framework's probe run; the table is the real run's
	}
	printTable(fmt.Sprintf("%s: cycle = create → first command done → destroy; ready = create returned (agent answered); ms", b.Name()), rows)
}
