package sys

import "golang.org/x/sys/unix"

// PowerOff syncs the file systems and powers the machine off (a VM
// guest's init does, as PID 1); it returns only if the kernel refuses.
func PowerOff() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

// LoadModule loads the kernel module in the open file fd, with no
// parameters (finit_module(2)).
func LoadModule(fd int) error { return unix.FinitModule(fd, "", 0) }
