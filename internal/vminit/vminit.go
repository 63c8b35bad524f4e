// Package vminit is dsec-guest's init mode inside a microVM: PID 1 of
// the initramfs that internal/vmkernel builds. It mounts /proc, /sys and
// /dev, loads the kernel modules the initramfs carries in the order its
// ModulesList gives, waits for the virtio console, and announces itself
// with a ReadyPrefix line on the serial console (ttyS0) and on the virtio
// console (hvc0). For now it then only waits for "poweroff" on hvc0, or
// powers off at once when the kernel command line has dsec.test=poweroff.
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
	// TestParam is the kernel command line parameter for test modes;
	// dsec.test=poweroff powers off right after the ready line.
	TestParam = "dsec.test"
)

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
