// Package vminit is dsec-guest's init mode inside a microVM: PID 1 of
// the initramfs that internal/vm/vmkernel builds. It mounts /proc, /sys and
// /dev and loads the kernel modules the initramfs carries in the order its
// ModulesList gives.
//
// # Sandbox mode
//
// When the VM has a virtio-blk disk with serial vmconfig.DiskSerial, the
// guest is a sandbox. The init reads its vmconfig.Config from that disk
// (disks are found by /sys/block/vd*/serial), mounts each layer's EROFS
// metadata disk with its blob disk as the extra device
// (-o ro,device=/dev/vdY) on /lower/<i>, stacks them under an upper
// directory: the ext4 disk with serial Config.UpperDisk (loading
// UpperModules first), or without one a tmpfs of Config.UpperMiB (which
// counts in the guest's RAM), writes /etc/hostname, hosts and resolv.conf
// into the overlay, mounts proc, sys, dev, dev/pts and dev/shm in it and
// switches into it the way switch_root does (the initramfs's rootfs cannot
// be pivot_root'ed: the overlay is moved over / and the init chroots into
// it). It then prints the ReadyPrefix line on ttyS0 and becomes the agent
// (internal/guest/agent) on the virtio-serial port named AgentPortName, which
// QEMU bridges to a unix socket on the host: the same protocol as in
// container sandboxes, over a byte stream instead of a socket (one
// connection at a time; when the host disconnects, reads see EOF, the
// connection ends and the port is reopened for the next). As PID 1, the
// agent reaps every orphan.
//
// With vmconfig.Config.Init (the vm tier) and a root whose /sbin/init is
// systemd, the init instead starts the agent as a process of its own
// (dsec-guest AgentArg: a child subreaper) and executes /sbin/init, so
// that systemd is PID 1 and boots the image's units (init_linux.go).
//
// The agent runs as root with every capability in the guest. Unlike a
// container's agent, it is not what isolates the sandbox: the guest as a
// whole is inside the trust boundary, and the VM is the isolation. It
// therefore applies phases' in-guest parts itself (agent.Options.Phases:
// killing the earlier phase's processes, the read-only root and writable
// paths). It starts every command in the cgroup /sys/fs/cgroup/commands,
// whose pids and memory limits leave the agent room (a fork bomb or a
// memory hog in the guest cannot starve it of threads or memory).
//
// # Test mode
//
// Without a config disk, it waits for the virtio console, announces
// itself with a ReadyPrefix line on the serial console (ttyS0) and on the
// virtio console (hvc0), then waits for "poweroff" on hvc0, or powers off
// at once when the kernel command line has dsec.test=poweroff.
package vminit

import (
	"fmt"
	"strings"
	"time"
)

const (
	// ModulesList is the initramfs file that lists the modules to load,
	// one absolute path a line, dependencies first.
	ModulesList = "/lib/modules/dsec.load"
	// ReadyPrefix starts the line the guest prints on both consoles once
	// it is up.
	ReadyPrefix = "DSEC-READY"
	// FailPrefix starts the line it prints before powering off when it
	// cannot come up.
	FailPrefix = "DSEC-FAIL"
	// PoweroffCommand, as a line on hvc0, powers the guest off.
	PoweroffCommand = "poweroff"
	// AgentPortName is the name of the virtio-serial port the agent
	// serves the node on (vmm.AgentPortName).
	AgentPortName = "dsec.agent"
	// TestParam is the kernel command line parameter for test modes;
	// dsec.test=poweroff powers off right after the ready line.
	TestParam = "dsec.test"
)

// DeviceModules maps the modules the guest loads only for a device to the
// virtio device ID ("0x0001": network) it needs: a VM without a network
// card skips virtio_net and its dependencies (~30 ms of a TCG boot).
var DeviceModules = map[string]string{
	"virtio_net": "0x0001", "net_failover": "0x0001", "failover": "0x0001",
}

// UpperModules are the file system of an upper disk
// (vmconfig.Config.UpperDisk), ext4 and its dependencies: loaded only for
// a VM that has one, after the config is read (~125–210 ms of a TCG boot).
var UpperModules = map[string]bool{
	"ext4": true, "jbd2": true, "mbcache": true, "crc16": true,
}

// AgentArg is dsec-guest's first argument in the agent process the init
// starts beside the image's init system.
const AgentArg = "vm-agent"

// PCIModules are the virtio PCI transport's modules, loaded only when the
// VM has a PCI bus (the vm tier's q35; microvm has none).
var PCIModules = map[string]bool{
	"virtio_pci": true, "virtio_pci_modern_dev": true, "virtio_pci_legacy_dev": true,
}

// moduleName is the module name of a .ko path ("/lib/modules/r/virtio_net.ko"
// gives "virtio_net").
func moduleName(p string) string {
	base := p[strings.LastIndex(p, "/")+1:]
	base, _, _ = strings.Cut(base, ".ko")
	return strings.ReplaceAll(base, "-", "_")
}

// hvcWait bounds the wait for /dev/hvc0 once a virtio console device is
// known to exist.
const hvcWait = 5 * time.Second

// cmdlineParam returns the value of the kernel command line parameter
// name ("" and false if absent; a bare name gives "" and true).
func cmdlineParam(cmdline, name string) (string, bool) {
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		if k == name {
			return v, true
		}
	}
	return "", false
}

// readyLine is the ready announcement, without its newline.
func readyLine(version string, uptime, modules time.Duration, loaded int) string {
	return fmt.Sprintf("%s version=%s uptime=%.3fs modules=%d/%dms", ReadyPrefix, version, uptime.Seconds(), loaded, modules.Milliseconds())
}

// parseModulesList returns the paths ModulesList names, skipping blank
// lines and # comments.
func parseModulesList(s string) []string {
	var paths []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			paths = append(paths, l)
		}
	}
	return paths
}
