//go:build linux && amd64

package guard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Guard is the programs attached to one cgroup2 directory. It is not
// safe for concurrent use.
type Guard struct {
	objs   guardObjects
	links  []link.Link
	pinDir string
}

// DefaultDeny are the destinations no sandbox reaches: link-local (the
// cloud metadata services among them) and AWS's IPv6 metadata address.
var DefaultDeny = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
}

// program is one of the guard's programs and where it attaches.
type program struct {
	name string // its pin's name and the kernel's name for it
	prog *ebpf.Program
	at   ebpf.AttachType
}

func (g *Guard) programs() []program {
	o := &g.objs
	return []program{
		{"connect4", o.Connect4, ebpf.AttachCGroupInet4Connect},
		{"sendmsg4", o.Sendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{"connect6", o.Connect6, ebpf.AttachCGroupInet6Connect},
		{"sendmsg6", o.Sendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{"sock_create", o.SockCreate, ebpf.AttachCGroupInetSockCreate},
		{"device", o.Device, ebpf.AttachCGroupDevice},
	}
}

// ProgramNames are the kernel's names of the guard's programs, sorted.
func ProgramNames() []string {
	var out []string
	for _, p := range (&Guard{}).programs() {
		out = append(out, p.name)
	}
	slices.Sort(out)
	return out
}

// Attach loads the programs, refuses opt.Deny but for the IPv4
// resolvers opt.DNS on port 53, and attaches them to the cgroup2
// directory dir (its descendants inherit them), next to any other
// programs there (multi-attach).
//
// With opt.PinDir, the links are pinned there and outlive the process
// (Keep); links a previous Guard pinned there for dir get the new
// programs in place (atomically: dir is never unguarded), pinned links
// of another directory, or defunct, are replaced by fresh ones, and any
// other pin in opt.PinDir is removed. The BPF file system is mounted at
// /sys/fs/bpf if nothing is. If Attach fails with opt.PinDir, nothing
// of the guard is left attached or pinned there.
//
// It fails with an error wrapping errdefs.ErrNotSupported where
// cgroup-bpf cannot load.
func Attach(dir string, opt Options) (_ *Guard, err error) {
	_ = rlimit.RemoveMemlock()
	g := &Guard{pinDir: opt.PinDir}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	if err := loadGuardObjects(&g.objs, nil); err != nil {
		return nil, fmt.Errorf("loading the cgroup-bpf guard: %w (%w)", err, errdefs.ErrNotSupported)
	}
	if err := g.fill(opt.Deny, opt.DNS); err != nil {
		return nil, err
	}
	if g.pinDir != "" {
		if err := mountBPFFS(); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(g.pinDir, 0o700); err != nil {
			return nil, fmt.Errorf("making the guard's pin directory: %w", err)
		}
	}
	cgid, err := cgroupID(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, p := range g.programs() {
		l, err := g.attach(dir, cgid, p)
		if err != nil {
			return nil, fmt.Errorf("attaching the cgroup-bpf guard's %s to %s: %w (%w)", p.name, dir, err, errdefs.ErrNotSupported)
		}
		g.links = append(g.links, l)
		names = append(names, p.name)
	}
	if g.pinDir != "" {
		// What an older agent pinned and this one has no program for.
		if err := removePins(g.pinDir, names); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// fill puts the refused destinations and the allowed resolvers in the
// maps.
func (g *Guard) fill(deny []netip.Prefix, dns []netip.Addr) error {
	for _, p := range deny {
		p = p.Masked()
		if p.Addr().Is4() {
			a := p.Addr().As4()
			k := guardKey4{Prefixlen: uint32(p.Bits()), Addr: binary.NativeEndian.Uint32(a[:])}
			if err := g.objs.Deny4.Put(k, uint8(1)); err != nil {
				return fmt.Errorf("cgroup-bpf guard: denying %s: %w", p, err)
			}
			continue
		}
		a := p.Addr().As16()
		k := guardKey6{Prefixlen: uint32(p.Bits())}
		for i := range k.Addr {
			k.Addr[i] = binary.NativeEndian.Uint32(a[4*i:])
		}
		if err := g.objs.Deny6.Put(k, uint8(1)); err != nil {
			return fmt.Errorf("cgroup-bpf guard: denying %s: %w", p, err)
		}
	}
	for _, a := range dns {
		if a = a.Unmap(); a.Is4() {
			b := a.As4()
			if err := g.objs.Dns4.Put(binary.NativeEndian.Uint32(b[:]), uint8(1)); err != nil {
				return fmt.Errorf("cgroup-bpf guard: allowing resolver %s: %w", a, err)
			}
		}
	}
	return nil
}

// attach attaches p to dir (cgroup id cgid): without a pin directory, a
// link of this process; with one, the pinned link of p if it is dir's
// and live, updated to p, or else a fresh link pinned in its place.
func (g *Guard) attach(dir string, cgid uint64, p program) (link.Link, error) {
	opts := link.CgroupOptions{Path: dir, Attach: p.at, Program: p.prog}
	if g.pinDir == "" {
		return link.AttachCgroup(opts)
	}
	pin := filepath.Join(g.pinDir, p.name)
	old, err := link.LoadPinnedLink(pin, nil)
	if err == nil {
		if info, err := old.Info(); err == nil && info.Cgroup() != nil &&
			info.Cgroup().CgroupId == cgid && ebpf.AttachType(info.Cgroup().AttachType) == p.at {
			if err := old.Update(p.prog); err == nil {
				return old, nil
			}
		}
		// Another directory's, or defunct (its group removed): the
		// rename below replaces its pin, and closing it detaches it.
		defer old.Close()
	}
	l, err := link.AttachCgroup(opts)
	if err != nil {
		return nil, err
	}
	// Pinned under a temporary name (bpffs refuses dots in names), then
	// renamed over the old pin: at every moment one of them holds a link
	// to dir.
	tmp := pin + "_new"
	_ = os.Remove(tmp)
	if err := l.Pin(tmp); err != nil {
		l.Close()
		return nil, fmt.Errorf("pinning: %w", err)
	}
	if err := os.Rename(tmp, pin); err != nil {
		_ = os.Remove(tmp)
		l.Close()
		return nil, fmt.Errorf("pinning: %w", err)
	}
	return l, nil
}

// Close detaches the programs and, with a pin directory, removes the
// pins and the directory: nothing of the guard is left.
func (g *Guard) Close() error {
	var errs []error
	if g.pinDir != "" {
		errs = append(errs, Remove(g.pinDir))
	}
	errs = append(errs, g.Keep())
	return errors.Join(errs...)
}

// Keep releases the process's handles on the guard. With a pin
// directory, the programs stay attached (held by their pins) for the
// next Attach with the same one to take over, or Remove to detach;
// without, they are detached as by Close.
func (g *Guard) Keep() error {
	for _, l := range g.links {
		l.Close()
	}
	g.links = nil
	return g.objs.Close()
}

// Remove detaches what a guard pinned in pinDir and removes the pins and
// the directory. A pinDir that does not exist is no error.
func Remove(pinDir string) error {
	if err := removePins(pinDir, nil); err != nil {
		return err
	}
	if err := os.Remove(pinDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the guard's pin directory: %w", err)
	}
	return nil
}

// removePins removes the pins in dir but those named in keep; a link
// whose last pin goes, and that no process holds, is detached.
func removePins(dir string, keep []string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("reading the guard's pin directory: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if slices.Contains(keep, e.Name()) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpinning the guard: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Attached lists the kernel's names of the guard's programs attached to
// the cgroup2 directory dir itself (not inherited from its ancestors),
// sorted: ProgramNames where the guard is attached to dir once, nothing
// where it is not.
func Attached(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	for _, p := range (&Guard{}).programs() {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: p.at})
		if err != nil {
			return nil, fmt.Errorf("querying %s programs of %s: %w", p.at, dir, err)
		}
		for _, ap := range res.Programs {
			prog, err := ebpf.NewProgramFromID(ap.ID)
			if err != nil {
				continue // detached meanwhile
			}
			info, err := prog.Info()
			prog.Close()
			if err == nil && info.Name == p.name {
				out = append(out, p.name)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// cgroupID is the id of the cgroup2 directory dir (its inode number).
func cgroupID(dir string) (uint64, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return 0, fmt.Errorf("cgroup-bpf guard: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("cgroup-bpf guard: no inode number for %s", dir)
	}
	return st.Ino, nil
}

// bpfFSMagic is BPF_FS_MAGIC, the BPF file system's statfs type.
const bpfFSMagic = 0xcafe4a11

// mountBPFFS mounts the BPF file system at /sys/fs/bpf unless it is
// there. Agents starting at once take turns (a lock on the directory
// under the mount point), so that one does not mount over the other's.
func mountBPFFS() error {
	d, err := os.Open(bpffs)
	if err != nil {
		return fmt.Errorf("opening %s: %w", bpffs, err)
	}
	defer d.Close()
	if err := sys.Lock(d); err != nil {
		return fmt.Errorf("locking %s: %w", bpffs, err)
	}
	if t, err := sys.FSType(bpffs); err == nil && t == bpfFSMagic {
		return nil
	}
	if err := sys.Mount("bpf", bpffs, "bpf", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "mode=0700"); err != nil {
		return fmt.Errorf("mounting the BPF file system at %s: %w", bpffs, err)
	}
	return nil
}
