package vminit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/vm/vmconfig"
)

// Run is the guest's init: it brings the guest up, prints the ready line
// and waits for the poweroff request. It refuses to run unless it is
// PID 1; once it is, it does not return: it powers the machine off, after
// printing a FailPrefix line if something went wrong.
func Run(version string) error {
	if os.Getpid() != 1 {
		return errors.New("vminit: not PID 1 of a VM guest")
	}
	g := &guest{version: version, console: os.Stdout}
	if err := g.run(); err != nil {
		g.say(FailPrefix + " " + err.Error())
	}
	poweroff()
	return nil // not reached
}

// guest is the init's state; used by the one goroutine of Run.
type guest struct {
	version string
	console io.Writer     // ttyS0, else the kernel's /dev/console
	hvc     *os.File      // the virtio console, if the VM has one
	modules time.Duration // loading the modules took
	loaded  int           // modules loaded
	initAt  time.Duration // the guest's uptime when the init started
	devices time.Duration // finding the config disk and the agent port took
	// Loading UpperModules and mounting the upper disk took.
	upperModules, upperMount time.Duration
}

func (g *guest) run() error {
	for _, m := range []struct{ fstype, target string }{
		{"proc", "/proc"}, {"sysfs", "/sys"}, {"devtmpfs", "/dev"},
	} {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return err
		}
		if err := sys.Mount(m.fstype, m.target, m.fstype, syscall.MS_NOSUID|syscall.MS_NOEXEC, ""); err != nil && !errors.Is(err, syscall.EBUSY) {
			return fmt.Errorf("mounting %s: %w", m.target, err)
		}
	}
	g.initAt = uptime()
	if f, err := os.OpenFile("/dev/ttyS0", os.O_WRONLY|syscall.O_NOCTTY, 0); err == nil {
		g.console = f
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	start := time.Now()
	n, err := loadModules()
	if err != nil {
		return err
	}
	g.modules, g.loaded = time.Since(start), n
	start = time.Now()
	disks := findDisks()
	if dev := disks[vmconfig.DiskSerial]; dev != "" {
		cfg, err := readConfig(dev)
		if err != nil {
			return err
		}
		port, err := findPort(AgentPortName, devWait)
		if err != nil {
			return err
		}
		g.devices = time.Since(start)
		return g.sandbox(cfg, disks, port)
	}
	if err := g.openHVC(); err != nil {
		return err
	}
	g.say(g.readyLine())
	if v, _ := cmdlineParam(string(cmdline), TestParam); v == "poweroff" {
		return nil
	}
	if g.hvc == nil {
		// Nothing to serve: wait for the host to stop the VM. Not select{}:
		// with no other goroutine, the Go runtime calls that a deadlock and
		// exits, which panics the kernel.
		for {
			time.Sleep(time.Hour)
		}
	}
	s := bufio.NewScanner(g.hvc)
	for s.Scan() {
		if strings.TrimSpace(s.Text()) == PoweroffCommand {
			return nil
		}
	}
	return fmt.Errorf("reading hvc0: %v", s.Err())
}

// readyLine is the ready announcement with the guest's timings.
func (g *guest) readyLine() string {
	return fmt.Sprintf("%s init=%.3fs", readyLine(g.version, uptime(), g.modules, g.loaded), g.initAt.Seconds())
}

// say prints line on the serial console and the virtio console.
func (g *guest) say(line string) {
	fmt.Fprintln(g.console, line)
	if g.hvc != nil {
		fmt.Fprintln(g.hvc, line)
	}
}

// loadModules loads the modules ModulesList names, in its order, but
// UpperModules (loadUpperModules loads them when the VM has an upper
// disk). A module already loaded (or built in) is not an error. A module
// of DeviceModules is skipped when the VM has no virtio device of its
// type, one of PCIModules when it has no PCI bus
// (the modules before it in the list, virtio_mmio among them, have
// registered the VM's devices by then).
func loadModules() (int, error) {
	return loadListed(func(name string) bool { return !UpperModules[name] })
}

// loadUpperModules loads UpperModules, in ModulesList's order.
func loadUpperModules() (int, error) {
	return loadListed(func(name string) bool { return UpperModules[name] })
}

// loadListed loads the modules of ModulesList that want accepts, as
// loadModules says.
func loadListed(want func(name string) bool) (int, error) {
	b, err := os.ReadFile(ModulesList)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	var devices map[string]bool // virtio device IDs, read when first needed
	pci := hasPCI()
	for _, p := range parseModulesList(string(b)) {
		if !want(moduleName(p)) || PCIModules[moduleName(p)] && !pci {
			continue
		}
		if id, ok := DeviceModules[moduleName(p)]; ok {
			if devices == nil {
				devices = virtioDevices()
			}
			if !devices[id] {
				continue
			}
		}
		f, err := os.Open(p)
		if err != nil {
			return n, err
		}
		err = sys.LoadModule(int(f.Fd()))
		f.Close()
		if err != nil && !errors.Is(err, syscall.EEXIST) {
			return n, fmt.Errorf("loading %s: %w", filepath.Base(p), err)
		}
		n++
	}
	return n, nil
}

// hasPCI reports whether the VM has PCI devices (/sys/bus/pci/devices).
func hasPCI() bool {
	devs, _ := filepath.Glob("/sys/bus/pci/devices/*")
	return len(devs) > 0
}

// virtioDevices returns the IDs of the VM's virtio devices
// (/sys/bus/virtio/devices/*/device: "0x0001"…).
func virtioDevices() map[string]bool {
	out := map[string]bool{}
	devs, _ := filepath.Glob("/sys/bus/virtio/devices/*/device")
	for _, d := range devs {
		if b, err := os.ReadFile(d); err == nil {
			out[strings.TrimSpace(string(b))] = true
		}
	}
	return out
}

// virtioConsoleID is the virtio device ID of a console.
const virtioConsoleID = "0x0003"

// openHVC opens /dev/hvc0 if the VM has a virtio console, waiting for
// devtmpfs to create the node.
func (g *guest) openHVC() error {
	if !virtioDevices()[virtioConsoleID] {
		return nil
	}
	deadline := time.Now().Add(hvcWait)
	for {
		f, err := os.OpenFile("/dev/hvc0", os.O_RDWR|syscall.O_NOCTTY, 0)
		if err == nil {
			g.hvc = f
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("virtio console without /dev/hvc0: %w", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// uptime is the time since the guest kernel started (/proc/uptime).
func uptime() time.Duration {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	d, _ := time.ParseDuration(f[0] + "s")
	return d
}

// poweroff syncs and powers the machine off; it returns only if the
// kernel refuses.
func poweroff() {
	_ = sys.PowerOff()
}
