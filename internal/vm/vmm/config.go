package vmm

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Machine is a QEMU machine type.
type Machine string

const (
	// MicroVM is QEMU's microvm machine: virtio-mmio devices only, no PCI,
	// direct kernel boot (a PVH vmlinux) through the minimal qboot firmware.
	MicroVM Machine = "microvm"
	// Q35 is a full PC (PCI, ACPI, SeaBIOS), for images with their own
	// kernel and init system.
	Q35 Machine = "q35"
)

// Accelerators.
const (
	AccelTCG = "tcg"
	AccelKVM = "kvm"
)

// Names of the files Start creates in Config.RunDir.
const (
	QMPSocket    = "qmp.sock"    // QMP, the control channel
	AgentSocket  = "agent.sock"  // the guest agent's virtio-serial port
	SerialSocket = "serial.sock" // the serial console, read by the VM handle
	SerialLog    = "console.log" // the serial console's capped log (+ ".1")
)

// DefaultSerialLogMax caps the serial console log when Config.SerialLogMax
// is zero.
const DefaultSerialLogMax = 1 << 20

// AgentPortName is the virtio-serial port name dsec-guest looks for
// (/dev/virtio-ports/dsec.agent).
const AgentPortName = "dsec.agent"

// Disk is a raw disk image given to the guest as one virtio-blk device.
type Disk struct {
	Path string
	// Serial, if set, is the disk's virtio-blk serial (the guest reads it
	// in /sys/block/vd*/serial): at most 20 of A-Z a-z 0-9 . _ -.
	Serial string
}

// Config describes one VM. The zero value is not valid: Machine, CPUs,
// MemoryMiB and RunDir are required.
type Config struct {
	// Name labels the VM in QEMU (-name guest=…) and in errors; optional,
	// [A-Za-z0-9._-]{0,64}.
	Name    string
	Machine Machine
	// Accel is AccelTCG or AccelKVM (see ProbeAccel); empty means TCG.
	Accel     string
	CPUs      int
	MemoryMiB int

	// Kernel (an uncompressed PVH vmlinux boots fastest), Initrd and
	// Cmdline boot the guest directly. Required for microvm; optional for
	// q35, whose firmware otherwise boots the first disk.
	Kernel, Initrd, Cmdline string

	// Disks are given read-only (readonly=on), in order: the guest sees
	// them as /dev/vda, /dev/vdb… on microvm (virtio-mmio probe order).
	Disks []Disk
	// Writable, if set, is one more disk after Disks, writable.
	Writable *Disk

	// Agent adds a virtio-serial port bridged to RunDir/agent.sock (a
	// listening socket the host connects to). AgentConsole makes it a
	// virtconsole (/dev/hvc0) instead of the named port AgentPortName.
	Agent        bool
	AgentConsole bool

	// Tap, if set, is the name of an existing tap device given to the
	// guest as its virtio-net interface (QEMU opens it; no scripts run).
	Tap string
	// TapFD gives the guest a virtio-net interface on the tap device
	// TapFile, an open /dev/net/tun file the caller attached to a tap
	// (TUNSETIFF), wherever it wants it (another network namespace): Start
	// passes it to QEMU as fd 3 (-netdev tap,fd=3), so QEMU needs no
	// privilege over the tap and does not join its namespace. The caller
	// may close its TapFile once Start returns. TapFile is not recorded
	// (Adopt does not need it); TapFD is. Exclusive with Tap.
	TapFD   bool
	TapFile *os.File `json:"-"`
	// MAC of the virtio-net interface; QEMU picks one if empty.
	MAC string

	// RunDir is an existing directory, private to this VM, where Start
	// creates the sockets and the serial log. Unix socket paths are
	// limited to 107 bytes, so keep it short.
	RunDir string
	// SerialLogMax caps the serial console log on disk (current file plus
	// one rotated file); zero means DefaultSerialLogMax.
	SerialLogMax int64

	// Paused leaves the guest stopped before its first instruction (QMP
	// status "prelaunch") instead of starting it.
	Paused bool

	// User, if set, is the uid and gid QEMU runs as (set before it
	// executes), with no supplementary groups but User.Groups. RunDir
	// must be writable to it and every disk, kernel and initrd readable.
	User *User `json:",omitempty"`

	// PassFiles makes Start open Kernel, Initrd and the disks itself and
	// hand them to QEMU as inherited descriptors, named /proc/self/fd/<n>
	// on its command line (FileFDs): QEMU then needs no search permission
	// on their directories, only the files' own modes (readable, or
	// writable for Writable, by User).
	PassFiles bool `json:",omitempty"`

	// Binary is the QEMU executable; empty means "qemu-system-x86_64"
	// from PATH.
	Binary string
	// ShutdownGrace is how long Shutdown waits for the guest to power off
	// after an ACPI power button press; zero means 3 s.
	ShutdownGrace time.Duration
}

// User is an unprivileged identity for QEMU (Config.User).
type User struct {
	UID, GID uint32
	// Groups are the only supplementary groups (e.g. /dev/kvm's group
	// when the VM uses KVM); empty means none.
	Groups []uint32 `json:",omitempty"`
}

// Error codes of invalid configurations (class errdefs.Invalid).
const (
	CodeInvalidConfig = api.CodeVMConfigInvalid
)

var (
	nameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{0,64}$`)
	tapRE  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,15}$`)
	macRE  = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
	// virtio-blk serials are at most 20 bytes (VIRTIO_BLK_ID_BYTES).
	serialRE = regexp.MustCompile(`^[A-Za-z0-9._-]{0,20}$`)
)

// maxSocketPath is the longest unix socket path (sun_path less the NUL).
const maxSocketPath = 107

// Limits that catch typos (a size in bytes for MiB) rather than enforce
// policy, which is the caller's.
const (
	maxCPUs      = 64
	maxMemoryMiB = 1 << 20
)

func invalid(format string, args ...any) error {
	return errdefs.New(errdefs.Invalid, CodeInvalidConfig, "vm config: "+format, args...)
}

// Validate reports the first problem of c as an errdefs.Invalid error with
// code CodeInvalidConfig, or nil.
func (c *Config) Validate() error {
	switch c.Machine {
	case MicroVM, Q35:
	default:
		return invalid("machine %q is not %q or %q", c.Machine, MicroVM, Q35)
	}
	switch c.Accel {
	case "", AccelTCG, AccelKVM:
	default:
		return invalid("accelerator %q is not %q or %q", c.Accel, AccelTCG, AccelKVM)
	}
	if !nameRE.MatchString(c.Name) {
		return invalid("name %q: want at most 64 of A-Z a-z 0-9 . _ -", c.Name)
	}
	if c.CPUs < 1 || c.CPUs > maxCPUs {
		return invalid("%d vCPUs: want 1 to %d", c.CPUs, maxCPUs)
	}
	if c.MemoryMiB < 16 || c.MemoryMiB > maxMemoryMiB {
		return invalid("%d MiB of memory: want 16 to %d", c.MemoryMiB, maxMemoryMiB)
	}
	if c.Machine == MicroVM && c.Kernel == "" && !c.Paused {
		return invalid("a microvm needs a kernel")
	}
	if c.Kernel == "" && (c.Initrd != "" || c.Cmdline != "") {
		return invalid("an initrd or kernel command line needs a kernel")
	}
	for _, p := range []struct{ what, path string }{{"kernel", c.Kernel}, {"initrd", c.Initrd}} {
		if p.path != "" && !filepath.IsAbs(p.path) {
			return invalid("%s path %q is not absolute", p.what, p.path)
		}
	}
	for i, d := range c.Disks {
		if !filepath.IsAbs(d.Path) {
			return invalid("disk %d path %q is not absolute", i, d.Path)
		}
		if !serialRE.MatchString(d.Serial) {
			return invalid("disk %d serial %q: want at most 20 of A-Z a-z 0-9 . _ -", i, d.Serial)
		}
	}
	if c.Writable != nil && !filepath.IsAbs(c.Writable.Path) {
		return invalid("writable disk path %q is not absolute", c.Writable.Path)
	}
	if c.Writable != nil && !serialRE.MatchString(c.Writable.Serial) {
		return invalid("writable disk serial %q: want at most 20 of A-Z a-z 0-9 . _ -", c.Writable.Serial)
	}
	if n := len(c.Disks) + btoi(c.Writable != nil); n > 24 {
		return invalid("%d disks: want at most 24", n)
	}
	if c.AgentConsole && !c.Agent {
		return invalid("AgentConsole needs Agent")
	}
	if c.Tap != "" && !tapRE.MatchString(c.Tap) {
		return invalid("tap name %q is not an interface name", c.Tap)
	}
	if c.Tap != "" && c.TapFD {
		return invalid("a tap by name and a tap file are exclusive")
	}
	if c.MAC != "" && (c.Tap == "" && !c.TapFD || !macRE.MatchString(c.MAC)) {
		return invalid("MAC %q: want lower-case aa:bb:cc:dd:ee:ff and a tap", c.MAC)
	}
	if c.RunDir == "" || !filepath.IsAbs(c.RunDir) {
		return invalid("run directory %q is not an absolute path", c.RunDir)
	}
	for _, s := range []string{QMPSocket, AgentSocket, SerialSocket} {
		if p := filepath.Join(c.RunDir, s); len(p) > maxSocketPath {
			return invalid("socket path %s is longer than %d bytes", p, maxSocketPath)
		}
	}
	if c.User != nil && (c.User.UID == 0 || c.User.GID == 0) {
		return invalid("user %d:%d: QEMU is not run as root through User", c.User.UID, c.User.GID)
	}
	if c.SerialLogMax < 0 {
		return invalid("negative serial log cap")
	}
	if c.ShutdownGrace < 0 {
		return invalid("negative shutdown grace")
	}
	return nil
}

// passedFiles are the paths Start opens and passes with PassFiles, in
// descriptor order from firstPassedFD, and whether each is opened for
// writing.
func (c *Config) passedFiles() (paths []string, write []bool) {
	add := func(p string, w bool) {
		if p != "" {
			paths, write = append(paths, p), append(write, w)
		}
	}
	add(c.Kernel, false)
	add(c.Initrd, false)
	for _, d := range c.Disks {
		add(d.Path, false)
	}
	if c.Writable != nil {
		add(c.Writable.Path, true)
	}
	return paths, write
}

// file is how QEMU's command line names path: itself, or with PassFiles
// the descriptor Start passes it as.
func (c *Config) file(path string) string {
	if !c.PassFiles {
		return path
	}
	paths, _ := c.passedFiles()
	for i, p := range paths {
		if p == path {
			return "/proc/self/fd/" + strconv.Itoa(c.firstPassedFD()+i)
		}
	}
	return path
}

// firstPassedFD is the descriptor of the first passed file in QEMU: 3,
// or 4 when the tap (TapFD) takes 3.
func (c *Config) firstPassedFD() int { return tapFD + btoi(c.TapFD) }

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (c *Config) accel() string {
	if c.Accel == "" {
		return AccelTCG
	}
	return c.Accel
}

func (c *Config) binary() string {
	if c.Binary == "" {
		return "qemu-system-x86_64"
	}
	return c.Binary
}

func (c *Config) serialLogMax() int64 {
	if c.SerialLogMax == 0 {
		return DefaultSerialLogMax
	}
	return c.SerialLogMax
}

func (c *Config) shutdownGrace() time.Duration {
	if c.ShutdownGrace == 0 {
		return 3 * time.Second
	}
	return c.ShutdownGrace
}

func (c *Config) label() string {
	if c.Name != "" {
		return c.Name
	}
	return fmt.Sprintf("vm in %s", c.RunDir)
}
