package vmtier

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// guestExec runs sh -c script in sb.
func guestExec(t *testing.T, ctx context.Context, sb sandbox.Sandbox, script string) api.ExecResult {
	t.Helper()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{"sh", "-c", script}}})
	if err != nil {
		t.Fatalf("Exec %q: %v", script, err)
	}
	return res
}

// memAvailable is the guest's MemAvailable, in MiB, after dropping its
// clean page cache (written files on a disk leave clean pages behind).
func memAvailable(t *testing.T, ctx context.Context, sb sandbox.Sandbox) int {
	t.Helper()
	res := guestExec(t, ctx, sb, `sync; echo 3 > /proc/sys/vm/drop_caches; awk '/^MemAvailable:/ {print int($2/1024)}' /proc/meminfo`)
	n, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("MemAvailable: %+v", res)
	}
	return n
}

// allocatedMiB is how much of the host's disk path takes.
func allocatedMiB(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512 >> 20
}

// fillUpper checks a VM with a 64 MiB upper disk: 50 MiB written land in
// the host's file, not in the guest's memory; writing beyond is ENOSPC
// (for commands and the files API); the agent stays up; deleting frees the
// host's blocks (discard); Destroy removes the file. uid is QEMU's (0
// unjailed).
func fillUpper(t *testing.T, ctx context.Context, rt *Runtime, sb sandbox.Sandbox, uid int) {
	t.Helper()
	img := filepath.Join(sb.(*Sandbox).RunDir(), upperFile)
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatalf("the upper disk: %v", err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Size() != 64<<20 || int(st.Uid) != uid || fi.Mode().Perm() != 0o600 {
		t.Errorf("upper.img: size %d, uid %d, mode %v; want 64 MiB, %d, 0600", fi.Size(), st.Uid, fi.Mode().Perm(), uid)
	}
	before, hostBefore := memAvailable(t, ctx, sb), allocatedMiB(t, img)
	if res := guestExec(t, ctx, sb, "dd if=/dev/zero of=/root/fill bs=1M count=50 2>&1 && sync && df -k / | tail -1"); res.ExitCode != 0 {
		t.Fatalf("writing 50 MiB: %+v", res)
	} else {
		t.Logf("after 50 MiB: df / %s", strings.Join(strings.Fields(res.Stdout), " "))
	}
	after, hostAfter := memAvailable(t, ctx, sb), allocatedMiB(t, img)
	t.Logf("guest MemAvailable %d -> %d MiB; host upper.img %d -> %d MiB allocated", before, after, hostBefore, hostAfter)
	if before-after > 16 {
		t.Errorf("writing 50 MiB to the upper disk took %d MiB of the guest's memory", before-after)
	}
	if hostAfter-hostBefore < 48 {
		t.Errorf("the host's upper.img grew by %d MiB for 50 MiB written", hostAfter-hostBefore)
	}
	res := guestExec(t, ctx, sb, "dd if=/dev/zero of=/root/more bs=1M count=64 2>&1")
	if res.ExitCode == 0 || !strings.Contains(res.Stdout+res.Stderr, "No space left on device") {
		t.Errorf("writing past the disk's end: %+v; want ENOSPC", res)
	}
	_, err = sb.Files().Write(ctx, "/workspace/big", strings.NewReader(strings.Repeat("x", 8<<20)), sandbox.WriteOptions{})
	if err == nil || !strings.Contains(err.Error(), "full") {
		t.Errorf("files API write to the full disk: %v; want the disk-full error", err)
	} else {
		t.Logf("files API on the full disk: %v", err)
	}
	if res := guestExec(t, ctx, sb, "echo alive"); res.Stdout != "alive\n" {
		t.Errorf("the agent after ENOSPC: %+v", res)
	}
	if st, err := sb.Stats(ctx); err != nil {
		t.Errorf("Stats: %v", err)
	} else {
		t.Logf("stats on the full disk: %+v", st)
		if !st.DiskFull || st.DiskLimitBytes == 0 {
			t.Errorf("Stats on the full disk: DiskFull %v, DiskLimitBytes %d", st.DiskFull, st.DiskLimitBytes)
		}
	}
	if res := guestExec(t, ctx, sb, "rm -f /root/fill /root/more /workspace/big && sync && sleep 1"); res.ExitCode != 0 {
		t.Errorf("rm: %+v", res)
	}
	freed := allocatedMiB(t, img)
	t.Logf("host upper.img after rm: %d MiB allocated", freed)
	if freed > hostBefore+16 {
		t.Errorf("deleting the files left %d MiB allocated in upper.img (discard)", freed)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("upper.img after Destroy: %v", err)
	}
}

// TestUpperDisk boots a jailed microVM with a 64 MiB upper disk and fills
// it (fillUpper), then, as the control, a VM whose upper is a tmpfs: the
// same 50 MiB do come out of the guest's memory.
func TestUpperDisk(t *testing.T) {
	rt, _ := jailedRuntime(t, vmm.MicroVM, "")
	ctx := ctxT(t, 5*time.Minute)
	sb, err := rt.Create(ctx, busyboxSpec("mvm-up1", Tier))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	t.Logf("upper disk made in %v", sb.(*Sandbox).timing.Upper)
	fillUpper(t, ctx, rt, sb, testUIDBase)

	rt.opt.Upper = UpperTmpfs
	sb, err = rt.Create(ctx, busyboxSpec("mvm-up2", Tier))
	if err != nil {
		t.Fatalf("Create (tmpfs): %v", err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	if _, err := os.Stat(filepath.Join(sb.(*Sandbox).RunDir(), upperFile)); !os.IsNotExist(err) {
		t.Errorf("a tmpfs upper's VM has an upper.img: %v", err)
	}
	before := memAvailable(t, ctx, sb)
	if res := guestExec(t, ctx, sb, "dd if=/dev/zero of=/root/fill bs=1M count=50 2>&1"); res.ExitCode != 0 {
		t.Fatalf("writing 50 MiB to the tmpfs: %+v", res)
	}
	after := memAvailable(t, ctx, sb)
	t.Logf("tmpfs upper: guest MemAvailable %d -> %d MiB", before, after)
	if before-after < 40 {
		t.Errorf("writing 50 MiB to the tmpfs upper took only %d MiB of the guest's memory: the control does not show the cost", before-after)
	}
	must(t, sb.Destroy(ctx))
}

// TestVMTierUpperDisk is fillUpper on the vm tier (q35: PCI virtio-blk),
// one boot.
func TestVMTierUpperDisk(t *testing.T) {
	rt, _ := jailedRuntime(t, vmm.Q35, "")
	ctx := ctxT(t, 5*time.Minute)
	sb, err := rt.Create(ctx, busyboxSpec("vm-up1", VMTier))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { sb.Destroy(context.Background()) })
	fillUpper(t, ctx, rt, sb, testUIDBase)
}

// TestUpperBootTime measures create-to-hello with an upper disk and with
// a tmpfs upper, five boots each, interleaved, and the host's cost of
// making the disk (DSEC_TEST_MICROVM_UPPERBENCH=1: ten boots).
func TestUpperBootTime(t *testing.T) {
	if os.Getenv("DSEC_TEST_MICROVM_UPPERBENCH") == "" {
		t.Skip("set DSEC_TEST_MICROVM_UPPERBENCH=1 to measure (ten TCG boots)")
	}
	rt, _ := newRuntime(t)
	ctx := ctxT(t, 10*time.Minute)
	const n = 5
	hello, root := map[string][]time.Duration{}, map[string][]time.Duration{}
	var upper []time.Duration
	for i := range 2 * n {
		// ABBA order: a boot right after another is slower, whichever
		// kind it is, on this shared host.
		kind := []string{UpperDisk, UpperTmpfs}[(i+i/2)%2]
		rt.opt.Upper = kind
		sb, err := rt.Create(ctx, busyboxSpec(fmt.Sprintf("mvm-u%d", i), Tier))
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		tm := sb.(*Sandbox).timing
		hello[kind] = append(hello[kind], tm.Hello)
		// The guest's time from its config to the agent (the ready
		// line's root=<n>ms): layers, upper, overlay, switch.
		line := readyLineOf(t, sb.(*Sandbox))
		t.Logf("%s: %s", kind, line)
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "root="); ok {
				if d, err := time.ParseDuration(v); err == nil {
					root[kind] = append(root[kind], d)
				}
			}
		}
		if kind == UpperDisk {
			upper = append(upper, tm.Upper)
		}
		must(t, sb.Destroy(ctx))
	}
	for _, kind := range []string{UpperDisk, UpperTmpfs} {
		h := hello[kind]
		slices.Sort(h)
		t.Logf("upper %s: create to hello p50 %v (min %v, max %v); guest root assembly p50 %v", kind,
			h[n/2].Round(time.Millisecond), h[0].Round(time.Millisecond), h[n-1].Round(time.Millisecond), pct(root[kind], 50))
	}
	slices.Sort(upper)
	t.Logf("upper disk (template copy): p50 %v (max %v)", upper[n/2].Round(time.Microsecond), upper[n-1].Round(time.Microsecond))
}
