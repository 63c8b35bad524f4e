package vminit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/vm/vmconfig"
)

// Where the init assembles the guest's root, in the initramfs.
const (
	lowerDir = "/lower" // /lower/<i>: layer i's EROFS mount
	upperDir = "/upper" // the upper disk or tmpfs: upper/ and work/
	newRoot  = "/newroot"
)

// devWait bounds the wait for a disk's or port's /dev node.
const devWait = 10 * time.Second

// findDisks maps the serials of the guest's virtio-blk disks
// (/sys/block/vd*/serial) to their /dev nodes.
func findDisks() map[string]string {
	out := map[string]string{}
	paths, _ := filepath.Glob("/sys/block/vd*/serial")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if s := strings.TrimRight(string(b), "\x00\n "); s != "" {
			out[s] = "/dev/" + filepath.Base(filepath.Dir(p))
		}
	}
	return out
}

// waitDev waits for devtmpfs to create the node path.
func waitDev(path string) error {
	deadline := time.Now().Add(devWait)
	for {
		_, err := os.Stat(path)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// readConfig reads the VM's config from the disk dev.
func readConfig(dev string) (*vmconfig.Config, error) {
	if err := waitDev(dev); err != nil {
		return nil, err
	}
	f, err := os.Open(dev)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, vmconfig.MaxSize))
	if err != nil {
		return nil, fmt.Errorf("reading the config disk: %w", err)
	}
	return vmconfig.Decode(b)
}

// sandbox turns the guest into a sandbox: it assembles the root from
// cfg's layers and an upper disk or tmpfs, switches into it, and serves the node
// as the agent on the dsec.agent port until the agent stops. The agent
// runs as root with every capability: the guest is inside the trust
// boundary, the VM is the isolation.
func (g *guest) sandbox(cfg *vmconfig.Config, disks map[string]string, agentPort string) error {
	start := time.Now()
	if err := setupNet(cfg.Net); err != nil {
		return err
	}
	var lowers []string // top first, as overlay wants them
	for i, l := range cfg.Layers {
		meta, blob := disks[l.Meta], disks[l.Blob]
		if meta == "" || blob == "" {
			return fmt.Errorf("layer %d: no disk with serial %q or %q", i, l.Meta, l.Blob)
		}
		for _, d := range []string{meta, blob} {
			if err := waitDev(d); err != nil {
				return err
			}
		}
		target := filepath.Join(lowerDir, strconv.Itoa(i))
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		if err := sys.Mount(meta, target, "erofs", syscall.MS_RDONLY, "device="+blob); err != nil {
			return fmt.Errorf("mounting layer %d (%s, %s): %w", i, meta, blob, err)
		}
		lowers = append([]string{target}, lowers...)
	}
	if err := g.mountUpper(cfg, disks); err != nil {
		return err
	}
	// The agent's handle on the writable layer, for snapshots: the
	// upper directory is out of reach by path once the init has switched
	// into the new root. Only an upper disk: a tmpfs cannot be frozen.
	var upper *os.File
	if cfg.UpperDisk != "" {
		f, err := os.OpenFile(upperDir+"/upper", os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return fmt.Errorf("opening the upper directory: %w", err)
		}
		upper = f
	}
	if err := os.MkdirAll(newRoot, 0o755); err != nil {
		return err
	}
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + upperDir + "/upper,workdir=" + upperDir + "/work"
	if err := sys.Mount("overlay", newRoot, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mounting the root overlay: %w", err)
	}
	if err := writeEtc(newRoot, cfg); err != nil {
		return err
	}
	if err := mountAPI(newRoot); err != nil {
		return err
	}
	if err := sys.SwitchRoot(newRoot); err != nil {
		return err
	}
	if cfg.Hostname != "" {
		if err := sys.Sethostname(cfg.Hostname); err != nil {
			return fmt.Errorf("setting the host name: %w", err)
		}
	}
	if err := guardThrashing(); err != nil {
		g.say(fmt.Sprintf("dsec: memory hogs may thrash before the OOM killer acts: %v", err))
	}
	if init := systemInit(); cfg.Init && init != "" {
		return g.handOver(cfg, agentPort, init, upper)
	}
	cgroup, err := commandCgroup()
	if err != nil {
		// The agent runs without: commands share its limits.
		g.say(fmt.Sprintf("dsec: no cgroup for commands: %v", err))
		cgroup = ""
	}
	l := newPortListener(agentPort)
	g.say(fmt.Sprintf("%s devices=%dms root=%dms upper=%dms+%dms", g.readyLine(), g.devices.Milliseconds(), time.Since(start).Milliseconds(),
		g.upperModules.Milliseconds(), g.upperMount.Milliseconds()))
	logger := slog.New(slog.NewTextHandler(g.console, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err = agent.Run(context.Background(), agent.Options{
		Listener:   l,
		Logger:     logger,
		Version:    g.version,
		DefaultEnv: append([]string{agent.DefaultPath}, cfg.Env...),
		// The guest is the sandbox: its agent applies phases inside it.
		Phases:        true,
		CommandCgroup: cgroup,
		Upper:         upper,
	})
	if err == nil {
		err = errors.New("the agent stopped")
	}
	return fmt.Errorf("agent: %w", err)
}

// mountUpper mounts the upper layer's file system on upperDir and makes
// its upper/ and work/ directories: the ext4 disk cfg.UpperDisk (noatime;
// discard, so that what is deleted frees the host's file; noinit_itable,
// as the node's mkfs left the inode tables lazily initialised and
// nothing needs them zeroed), else a tmpfs of cfg.UpperMiB.
func (g *guest) mountUpper(cfg *vmconfig.Config, disks map[string]string) error {
	if err := os.MkdirAll(upperDir, 0o755); err != nil {
		return err
	}
	if cfg.UpperDisk == "" {
		if err := sys.Mount("tmpfs", upperDir, "tmpfs", 0, fmt.Sprintf("size=%dm,mode=0755", cfg.UpperMiB)); err != nil {
			return fmt.Errorf("mounting the upper tmpfs: %w", err)
		}
	} else {
		dev := disks[cfg.UpperDisk]
		if dev == "" {
			return fmt.Errorf("no upper disk with serial %q", cfg.UpperDisk)
		}
		if err := waitDev(dev); err != nil {
			return err
		}
		start := time.Now()
		if _, err := loadUpperModules(); err != nil {
			return err
		}
		g.upperModules = time.Since(start)
		start = time.Now()
		if err := sys.Mount(dev, upperDir, "ext4", syscall.MS_NOATIME, "discard,noinit_itable"); err != nil {
			return fmt.Errorf("mounting the upper disk %s: %w", dev, err)
		}
		g.upperMount = time.Since(start)
		if err := os.Chmod(upperDir, 0o755); err != nil {
			return err
		}
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(upperDir, d), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// writeEtc writes the root's /etc/hostname, hosts and resolv.conf (in
// the upper) and creates the working directory, /workspace.
func writeEtc(root string, cfg *vmconfig.Config) error {
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		return err
	}
	files := map[string]string{"hosts": cfg.Hosts, "resolv.conf": cfg.Resolv}
	if cfg.Hostname != "" {
		files["hostname"] = cfg.Hostname + "\n"
	}
	for name, content := range files {
		if content == "" {
			continue
		}
		p := filepath.Join(root, "etc", name)
		os.Remove(p) // it may be a symlink (resolv.conf often is)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return sandbox.MakeWorkdir(root)
}

// mountAPI mounts /proc, /sys, /dev, /dev/pts and /dev/shm in root.
func mountAPI(root string) error {
	for _, m := range []struct {
		fstype, target, opts string
		flags                uintptr
	}{
		{"proc", "proc", "", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC},
		{"sysfs", "sys", "", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC},
		{"devtmpfs", "dev", "mode=0755", syscall.MS_NOSUID},
		{"devpts", "dev/pts", "gid=5,mode=0620,ptmxmode=0666", syscall.MS_NOSUID | syscall.MS_NOEXEC},
		{"tmpfs", "dev/shm", "mode=1777", syscall.MS_NOSUID | syscall.MS_NODEV},
	} {
		target := filepath.Join(root, m.target)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		if err := sys.Mount(m.fstype, target, m.fstype, m.flags, m.opts); err != nil {
			return fmt.Errorf("mounting %s: %w", m.target, err)
		}
	}
	return nil
}

// Where commands run, in the guest's cgroup2 tree.
const (
	cgroupRoot     = "/sys/fs/cgroup"
	commandsCgroup = cgroupRoot + "/commands"
)

// Headroom the commands' cgroup leaves the agent and the kernel: tasks
// (kernel threads count against kernel.threads-max too) and memory.
const (
	reservedTasks  = 256
	reservedMemory = 32 << 20
)

// commandCgroup mounts cgroup2 and makes the cgroup the agent starts
// every command in, with pids.max and memory.max below the guest's
// threads-max and memory by a reserve: a fork bomb or a memory hog hits
// the cgroup's limit (its OOM kills stay in it), and the agent, outside,
// can still make threads and allocate. It returns the cgroup's path.
func commandCgroup() (string, error) {
	if err := os.MkdirAll(cgroupRoot, 0o755); err != nil {
		return "", err
	}
	if err := sys.Mount("cgroup2", cgroupRoot, "cgroup2", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return "", fmt.Errorf("mounting cgroup2: %w", err)
	}
	if err := os.WriteFile(cgroupRoot+"/cgroup.subtree_control", []byte("+pids +memory"), 0); err != nil {
		return "", fmt.Errorf("enabling the pids and memory controllers: %w", err)
	}
	if err := os.Mkdir(commandsCgroup, 0o755); err != nil {
		return "", err
	}
	threads, err := readInt("/proc/sys/kernel/threads-max")
	if err != nil {
		return "", err
	}
	mem, err := memTotal()
	if err != nil {
		return "", err
	}
	pids := max(threads-reservedTasks, threads/2)
	memMax := max(mem-max(reservedMemory, mem/8), mem/2)
	for f, v := range map[string]int64{"pids.max": pids, "memory.max": memMax} {
		if err := os.WriteFile(commandsCgroup+"/"+f, []byte(strconv.FormatInt(v, 10)), 0); err != nil {
			return "", fmt.Errorf("setting %s: %w", f, err)
		}
	}
	// The agent, in the root group, outweighs every command together
	// (cpu.weight 1 against a task's 100): a command that spins or forks
	// without end on the guest's vCPUs leaves it the CPU to answer the
	// node. Best effort: without the cpu controller commands share it.
	if err := os.WriteFile(cgroupRoot+"/cgroup.subtree_control", []byte("+cpu"), 0); err == nil {
		_ = os.WriteFile(commandsCgroup+"/cpu.weight", []byte("1"), 0)
	}
	return commandsCgroup, nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// memTotal is the guest's MemTotal, in bytes.
func memTotal() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no MemTotal in /proc/meminfo")
}
