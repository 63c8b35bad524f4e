package daemon

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/config"
	"github.com/dsec-dev/dsec/internal/network"
)

// TestMicroVMNetworkThroughRestart: with the container tier on, a
// microvm and a container with a network policy both get addresses from
// the one network manager; across a node restart that keeps sandboxes,
// each tier's recovery keeps the other's networks (network.Shared) and
// re-adopts a microvm without network access without logging an error,
// and deleting them removes their namespaces.
func TestMicroVMNetworkThroughRestart(t *testing.T) {
	on := withMicroVM(t)
	ct := withContainers(t)
	names, rng := containerNames()
	adjust := func(c *config.Config) {
		on(c)
		ct(c)
		c.KeepSandboxes = true
	}
	dir := vmDataDir(t, "TestMvn")
	u := startUp(t, dir, adjust)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	policy := &api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: "198.51.100.2/32", Proto: "tcp", Ports: "80"}}}
	vm, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256, Network: policy})
	if err != nil {
		t.Fatalf("microvm with a network: %v", err)
	}
	box, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierContainer, Image: "busybox", Network: policy})
	if err != nil {
		t.Fatalf("container with a network: %v", err)
	}
	addrOf := func(id string) netip.Addr {
		t.Helper()
		res, err := u.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"/bin/sh", "-c", "ip -4 -o addr show dev eth0"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("ip addr in %s: %+v, %v", id, res, err)
		}
		for _, f := range strings.Fields(res.Stdout) {
			if p, err := netip.ParsePrefix(f); err == nil && rng.Contains(p.Addr()) {
				return p.Addr()
			}
		}
		t.Fatalf("%s has no address in %s: %q", id, rng, res.Stdout)
		return netip.Addr{}
	}
	vmAddr, boxAddr := addrOf(vm.ID), addrOf(box.ID)
	if vmAddr == boxAddr {
		t.Fatalf("the VM and the container share %s", vmAddr)
	}
	t.Logf("microvm %s at %s, container %s at %s", vm.ID, vmAddr, box.ID, boxAddr)
	netns := func(id string) string { return filepath.Join(network.DefaultNetnsDir, names.Net+"-"+id) }
	lone, err := u.c.CreateSandbox(ctx, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256})
	if err != nil {
		t.Fatalf("microvm without a network: %v", err)
	}

	u.stop()
	u = startUp(t, dir, adjust)
	if lines := u.log.matching("level=ERROR"); len(lines) > 0 {
		t.Errorf("the restart logged errors:\n%s", strings.Join(lines, "\n"))
	}
	if res, err := u.c.Exec(ctx, lone.ID, api.ExecRequest{Cmd: []string{"echo", "alive"}}); err != nil || res.Stdout != "alive\n" {
		t.Errorf("exec in the microvm without a network after the restart: %+v, %v", res, err)
	}
	for id, want := range map[string]netip.Addr{vm.ID: vmAddr, box.ID: boxAddr} {
		sb, err := u.c.GetSandbox(ctx, id)
		if err != nil || sb.State != api.StateRunning {
			t.Fatalf("after restart %s = %+v, %v", id, sb, err)
		}
		if got := addrOf(id); got != want {
			t.Errorf("after restart %s has %s, want %s", id, got, want)
		}
		if _, err := os.Stat(netns(id)); err != nil {
			t.Errorf("after restart, the namespace of %s: %v", id, err)
		}
	}

	if err := u.c.DeleteSandbox(ctx, lone.ID); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{vm.ID, box.ID} {
		if err := u.c.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(netns(id)); !os.IsNotExist(err) {
			t.Errorf("the namespace of %s after its delete: %v", id, err)
		}
	}
	u.stop()
	if ps := qemuProcsUnder(dir); len(ps) > 0 {
		t.Errorf("QEMU processes after the daemon stopped: %v", ps)
	}
}
