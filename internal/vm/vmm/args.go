package vmm

import (
	"path/filepath"
	"strconv"
	"strings"
)

// SandboxFlags is QEMU's -sandbox setting: its seccomp filter on, with
// obsolete system calls, privilege changes (setuid…), spawning processes
// (fork/exec: no tap scripts, no helpers) and resource-control calls
// (sched_setaffinity, setpriority…) denied.
const SandboxFlags = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// escape doubles commas, QEMU's escape inside a key=value option list.
func escape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// Args returns QEMU's command line for c (without the binary). The guest is
// always created stopped (-S): Start connects to QMP and to the serial
// console before it lets the guest run, so no early output is lost.
// Precondition: c.Validate() returned nil.
func (c *Config) Args() []string {
	// virtio-mmio devices on microvm (virtio-blk-device…), PCI on q35.
	bus := "-device"
	if c.Machine == Q35 {
		bus = "-pci"
	}
	a := []string{}
	add := func(s ...string) { a = append(a, s...) }
	if c.Name != "" {
		add("-name", "guest="+c.Name)
	}
	add("-M", string(c.Machine), "-accel", c.accel())
	if c.accel() == AccelKVM {
		add("-cpu", "host")
	}
	add("-smp", strconv.Itoa(c.CPUs), "-m", strconv.Itoa(c.MemoryMiB))
	add("-nodefaults", "-no-user-config", "-nographic", "-no-reboot")
	add("-sandbox", SandboxFlags)
	add("-S")
	sock := func(id, name string) string {
		return "socket,id=" + id + ",path=" + escape(filepath.Join(c.RunDir, name)) + ",server=on,wait=off"
	}
	add("-chardev", sock("qmp", QMPSocket), "-mon", "chardev=qmp,mode=control")
	add("-chardev", sock("serial0", SerialSocket), "-serial", "chardev:serial0")
	if c.Kernel != "" {
		add("-kernel", c.file(c.Kernel))
		if c.Initrd != "" {
			add("-initrd", c.file(c.Initrd))
		}
		if c.Cmdline != "" {
			add("-append", c.Cmdline)
		}
	}
	for i, d := range c.Disks {
		id := "ro" + strconv.Itoa(i)
		add("-drive", "id="+id+",file="+escape(c.file(d.Path))+",format=raw,if=none,readonly=on")
		add("-device", "virtio-blk"+bus+",drive="+id+serialOpt(d))
	}
	if c.Writable != nil {
		add("-drive", "id=rw0,file="+escape(c.file(c.Writable.Path))+",format=raw,if=none,discard=unmap")
		add("-device", "virtio-blk"+bus+",drive=rw0"+serialOpt(*c.Writable))
	}
	if c.Agent {
		port := "virtserialport,chardev=agent,name=" + AgentPortName
		if c.AgentConsole {
			port = "virtconsole,chardev=agent"
		}
		add("-device", "virtio-serial"+bus, "-chardev", sock("agent", AgentSocket), "-device", port)
	}
	if c.Tap != "" || c.TapFD {
		if c.TapFD {
			add("-netdev", "tap,id=net0,fd="+strconv.Itoa(tapFD))
		} else {
			add("-netdev", "tap,id=net0,ifname="+c.Tap+",script=no,downscript=no")
		}
		nic := "virtio-net" + bus + ",netdev=net0"
		if c.MAC != "" {
			nic += ",mac=" + c.MAC
		}
		add("-device", nic)
	}
	return a
}

// tapFD is the fd number of Config.TapFile in QEMU: the first of
// exec.Cmd.ExtraFiles.
const tapFD = 3

// serialOpt is the virtio-blk device option giving d its serial, if any.
func serialOpt(d Disk) string {
	if d.Serial == "" {
		return ""
	}
	return ",serial=" + d.Serial
}
