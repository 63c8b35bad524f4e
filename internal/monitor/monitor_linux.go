//go:build linux && amd64

package monitor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/sys"
)

// Monitor is the loaded and attached programs. It is safe for concurrent
// use.
type Monitor struct {
	log    *slog.Logger
	objs   monitorObjects
	links  []link.Link
	rd     *ringbuf.Reader
	events chan Event
	done   chan struct{}
	once   sync.Once
	boot   time.Time // see bootTime

	xmu     sync.Mutex          // guards following fields
	allowed map[uint64][]string // each restricted group's paths in exec_allowed
}

// Start loads and attaches the programs. Events go to the channel Events
// returns, which must be drained; if the kernel's ring buffer fills, the
// kernel drops events and counts them (Dropped).
func Start(log *slog.Logger) (*Monitor, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK.
	_ = rlimit.RemoveMemlock()
	m := &Monitor{log: log, events: make(chan Event, 4096), done: make(chan struct{}), boot: bootTime()}
	if err := loadMonitorObjects(&m.objs, nil); err != nil {
		return nil, notSupported("loading the monitor's programs", err)
	}
	for nr, s := range watchedSyscalls {
		if err := m.objs.Syscalls.Put(nr, s.kernel()); err != nil {
			m.objs.Close()
			return nil, fmt.Errorf("configuring the monitor: %w", err)
		}
	}
	for _, p := range []*ebpf.Program{m.objs.OnExec, m.objs.OnSysExit, m.objs.OnOomVictim} {
		l, err := link.AttachTracing(link.TracingOptions{Program: p})
		if err != nil {
			m.close()
			return nil, notSupported("attaching the monitor", err)
		}
		m.links = append(m.links, l)
	}
	rd, err := ringbuf.NewReader(m.objs.Events)
	if err != nil {
		m.close()
		return nil, fmt.Errorf("reading the monitor's events: %w", err)
	}
	m.rd = rd
	go m.read()
	return m, nil
}

func notSupported(what string, err error) error {
	return fmt.Errorf("%s: %w (%w)", what, err, errdefs.ErrNotSupported)
}

// Watch starts reporting the tasks of the cgroup2 group id.
func (m *Monitor) Watch(cgroupID uint64) error {
	return m.objs.Watched.Put(cgroupID, uint8(1))
}

// Unwatch stops reporting the group id (gone groups are no error).
func (m *Monitor) Unwatch(cgroupID uint64) error {
	err := m.objs.Watched.Delete(cgroupID)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// RestrictExec makes the tasks of cgroup2 group cgroupID run only files
// of the file system rootDev (a superblock's s_dev, the kernel's
// encoding: major << 20 | minor) at one of paths: absolute paths of
// files, of directories followed by "/*" (every file directly in one) or
// by "/**" (every file below one, at most 24 levels from the root), each
// shorter than 256 bytes. Any other exec is killed in the
// kernel before the new program runs, and its exec event has Ret -1
// (EPERM). It replaces the group's earlier paths; during the change an
// exec of the group may be killed that either set allows.
func (m *Monitor) RestrictExec(cgroupID, rootDev uint64, paths []string) error {
	keys := make([]monitorExecKey, 0, len(paths))
	for _, p := range paths {
		if len(p) == 0 || len(p) >= len(monitorExecKey{}.Path) || p[0] != '/' {
			return fmt.Errorf("allowed executable %q: an absolute path shorter than %d bytes", p, len(monitorExecKey{}.Path))
		}
		k := monitorExecKey{Cgroup: cgroupID}
		for i := 0; i < len(p); i++ {
			k.Path[i] = int8(p[i])
		}
		keys = append(keys, k)
	}
	m.xmu.Lock()
	defer m.xmu.Unlock()
	// The policy first: from here on the group runs nothing the map
	// does not allow (fail closed while the paths change).
	if err := m.objs.ExecPolicies.Put(cgroupID, monitorExecPolicy{RootDev: rootDev}); err != nil {
		return fmt.Errorf("restricting executables: %w", err)
	}
	m.dropPathsLocked(cgroupID, paths)
	for _, k := range keys {
		if err := m.objs.ExecAllowed.Put(k, uint8(1)); err != nil {
			return fmt.Errorf("allowing an executable: %w", err)
		}
	}
	if m.allowed == nil {
		m.allowed = map[uint64][]string{}
	}
	m.allowed[cgroupID] = slices.Clone(paths)
	return nil
}

// UnrestrictExec lets the group run any program again (a group never
// restricted is no error).
func (m *Monitor) UnrestrictExec(cgroupID uint64) error {
	m.xmu.Lock()
	defer m.xmu.Unlock()
	err := m.objs.ExecPolicies.Delete(cgroupID)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		err = nil
	}
	m.dropPathsLocked(cgroupID, nil)
	delete(m.allowed, cgroupID)
	return err
}

// dropPathsLocked removes the group's allowed paths but keep.
//
// Preconditions: m.xmu must be held.
func (m *Monitor) dropPathsLocked(cgroupID uint64, keep []string) {
	for _, p := range m.allowed[cgroupID] {
		if slices.Contains(keep, p) {
			continue
		}
		k := monitorExecKey{Cgroup: cgroupID}
		for i := 0; i < len(p); i++ {
			k.Path[i] = int8(p[i])
		}
		_ = m.objs.ExecAllowed.Delete(k)
	}
}

// Events returns the events, in the order each CPU produced them; it is
// closed by Close.
func (m *Monitor) Events() <-chan Event { return m.events }

// Dropped returns how many events the kernel dropped for want of room.
func (m *Monitor) Dropped() uint64 {
	var n uint64
	_ = m.objs.Dropped.Lookup(uint32(0), &n)
	return n
}

// Close detaches the programs and closes Events.
func (m *Monitor) Close() error {
	m.once.Do(func() {
		if m.rd != nil {
			m.rd.Close()
			<-m.done
		}
		m.close()
	})
	return nil
}

func (m *Monitor) close() {
	for _, l := range m.links {
		l.Close()
	}
	m.objs.Close()
}

func (m *Monitor) read() {
	defer close(m.done)
	defer close(m.events)
	for {
		rec, err := m.rd.Read()
		if err != nil {
			if !errors.Is(err, ringbuf.ErrClosed) {
				m.log.Warn("reading monitor events", "err", err)
			}
			return
		}
		var raw monitorEvent
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &raw); err != nil {
			m.log.Warn("decoding a monitor event", "err", err)
			continue
		}
		m.events <- decode(&raw, m.boot.Add(time.Duration(raw.Ts)))
	}
}

// decode turns the kernel's record into an Event.
func decode(raw *monitorEvent, at time.Time) Event {
	e := Event{
		Time: at, Cgroup: raw.Cgroup, Pid: raw.Tgid, Tid: raw.Pid, UID: raw.Uid,
		Comm: cstring(raw.Comm[:]), Ret: raw.Ret, Args: raw.Args,
	}
	switch raw.Kind {
	case 1:
		e.Kind, e.Path = KindExec, cstring(raw.Path[:])
		n := min(int(raw.AuxLen), len(raw.Aux))
		args := make([]byte, n)
		for i := range args {
			args[i] = byte(raw.Aux[i])
		}
		e.Argv = strings.Split(strings.TrimRight(string(args), "\x00"), "\x00")
	case 3:
		e.Kind = KindOOMKill
	default:
		e.Kind, e.Nr = KindSyscall, int(raw.Nr)
		s := watchedSyscalls[raw.Nr]
		e.Syscall = s.name
		if s.path >= 0 {
			e.Path = cleanPath(cstring(raw.Path[:]), s.dir)
		}
		if s.path2 >= 0 {
			e.Target = cleanPath(cstring(raw.Aux[:]), s.dir2)
		}
		if s.addr >= 0 {
			b := make([]byte, len(raw.Path))
			for i, c := range raw.Path {
				b[i] = byte(c)
			}
			e.Addr = sockaddr(b)
		}
	}
	return e
}

// cleanPath removes "." and ".." elements from an absolute path the
// kernel reported (lexically: a symlink the caller named is not
// followed). Names that are no path, and paths the kernel could not
// make absolute, stay as given.
func cleanPath(p string, dir int8) string {
	if dir == dirRaw || !strings.HasPrefix(p, "/") {
		return p
	}
	return path.Clean(p)
}

func cstring[T byte | int8](b []T) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// sockaddr reads an AF_INET or AF_INET6 address (network byte order).
func sockaddr(b []byte) netip.AddrPort {
	if len(b) < 8 {
		return netip.AddrPort{}
	}
	port := binary.BigEndian.Uint16(b[2:4])
	switch binary.NativeEndian.Uint16(b[0:2]) {
	case 2: // AF_INET
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port)
	case 10: // AF_INET6
		if len(b) >= 24 {
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])), port)
		}
	}
	return netip.AddrPort{}
}

// bootTime is when CLOCK_MONOTONIC (the kernel's event clock) read zero,
// as a time.Time that carries Go's monotonic reading: event times made
// from it compare with time.Now() on one clock, immune to wall-clock
// steps.
func bootTime() time.Time {
	now := time.Now()
	up, err := sys.Monotonic()
	if err != nil {
		return now // cannot fail on Linux
	}
	return now.Add(-up)
}
