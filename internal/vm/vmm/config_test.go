package vmm

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func TestValidate(t *testing.T) {
	good := Config{Machine: MicroVM, CPUs: 1, MemoryMiB: 256, Kernel: "/k", RunDir: "/run/vm"}
	tests := []struct {
		name string
		edit func(*Config)
		ok   bool
	}{
		{"good", func(*Config) {}, true},
		{"q35 without a kernel", func(c *Config) { c.Machine, c.Kernel = Q35, "" }, true},
		{"paused microvm without a kernel", func(c *Config) { c.Kernel, c.Paused = "", true }, true},
		{"unknown machine", func(c *Config) { c.Machine = "pc" }, false},
		{"unknown accelerator", func(c *Config) { c.Accel = "hvf" }, false},
		{"no vCPU", func(c *Config) { c.CPUs = 0 }, false},
		{"too many vCPUs", func(c *Config) { c.CPUs = 1000 }, false},
		{"memory in bytes", func(c *Config) { c.MemoryMiB = 256 << 20 }, false},
		{"microvm without a kernel", func(c *Config) { c.Kernel = "" }, false},
		{"initrd without a kernel", func(c *Config) { c.Machine, c.Kernel, c.Initrd = Q35, "", "/i" }, false},
		{"relative kernel", func(c *Config) { c.Kernel = "vmlinux" }, false},
		{"relative disk", func(c *Config) { c.Disks = []Disk{{Path: "layer.erofs"}} }, false},
		{"disk serial", func(c *Config) { c.Disks = []Disk{{Path: "/l/m.erofs", Serial: "l0m"}} }, true},
		{"long disk serial", func(c *Config) { c.Disks = []Disk{{Path: "/l/m.erofs", Serial: "a-serial-over-20-bytes"}} }, false},
		{"disk serial with comma", func(c *Config) { c.Disks = []Disk{{Path: "/l/m.erofs", Serial: "a,b"}} }, false},
		{"relative writable disk", func(c *Config) { c.Writable = &Disk{Path: "rw.img"} }, false},
		{"bad name", func(c *Config) { c.Name = "a b" }, false},
		{"bad tap", func(c *Config) { c.Tap = "tap0,script=/bin/evil" }, false},
		{"MAC without tap", func(c *Config) { c.MAC = "52:54:00:12:34:56" }, false},
		{"MAC with a tap file", func(c *Config) { c.TapFD, c.MAC = true, "52:54:00:12:34:56" }, true},
		{"tap by name and file", func(c *Config) { c.TapFD, c.Tap = true, "tap0" }, false},
		{"console without agent", func(c *Config) { c.AgentConsole = true }, false},
		{"no run directory", func(c *Config) { c.RunDir = "" }, false},
		{"run directory too long", func(c *Config) { c.RunDir = "/" + strings.Repeat("d", 100) }, false},
		{"negative log cap", func(c *Config) { c.SerialLogMax = -1 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.edit(&c)
			err := c.Validate()
			if tt.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if errdefs.ClassOf(err) != errdefs.Invalid || errdefs.CodeOf(err) != CodeInvalidConfig {
				t.Fatalf("got %v (%s), want %s", err, errdefs.CodeOf(err), CodeInvalidConfig)
			}
		})
	}
}

func TestArgs(t *testing.T) {
	c := Config{
		Name: "vm1", Machine: MicroVM, CPUs: 2, MemoryMiB: 512, RunDir: "/run/d,x",
		Kernel: "/k/vmlinux", Initrd: "/k/initrd", Cmdline: "console=ttyS0 quiet",
		Disks: []Disk{{Path: "/l/a.erofs"}, {Path: "/l/b,c.erofs", Serial: "l0b"}}, Writable: &Disk{Path: "/w/rw.img"},
		Agent: true, Tap: "tap0", MAC: "52:54:00:12:34:56",
	}
	got := strings.Join(c.Args(), " ")
	for _, want := range []string{
		"-name guest=vm1", "-M microvm -accel tcg -smp 2 -m 512",
		"-nodefaults -no-user-config -nographic -no-reboot", "-sandbox " + SandboxFlags, " -S ",
		"-chardev socket,id=qmp,path=/run/d,,x/qmp.sock,server=on,wait=off -mon chardev=qmp,mode=control",
		"-serial chardev:serial0",
		"-kernel /k/vmlinux -initrd /k/initrd -append console=ttyS0 quiet",
		"-drive id=ro0,file=/l/a.erofs,format=raw,if=none,readonly=on -device virtio-blk-device,drive=ro0",
		"file=/l/b,,c.erofs,format=raw,if=none,readonly=on -device virtio-blk-device,drive=ro1,serial=l0b",
		"-drive id=rw0,file=/w/rw.img,format=raw,if=none,discard=unmap -device virtio-blk-device,drive=rw0",
		"-device virtio-serial-device -chardev socket,id=agent,path=/run/d,,x/agent.sock,server=on,wait=off -device virtserialport,chardev=agent,name=dsec.agent",
		"-netdev tap,id=net0,ifname=tap0,script=no,downscript=no -device virtio-net-device,netdev=net0,mac=52:54:00:12:34:56",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("args lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "-pci") || strings.Contains(got, "-cpu") {
		t.Errorf("microvm on tcg with PCI devices or a CPU model: %s", got)
	}

	c.Machine, c.Accel, c.AgentConsole = Q35, AccelKVM, true
	args := c.Args()
	got = strings.Join(args, " ")
	for _, want := range []string{"-M q35 -accel kvm -cpu host", "virtio-blk-pci,drive=ro0", "-device virtio-serial-pci", "virtconsole,chardev=agent", "virtio-net-pci"} {
		if !strings.Contains(got, want) {
			t.Errorf("q35 args lack %q:\n%s", want, got)
		}
	}
	c.Tap, c.TapFD = "", true
	if got := strings.Join(c.Args(), " "); !strings.Contains(got, "-netdev tap,id=net0,fd=3 -device virtio-net-pci,netdev=net0,mac=52:54:00:12:34:56") {
		t.Errorf("args with a tap file:\n%s", got)
	}
	c.Tap, c.TapFD = "tap0", false
	// The cmdline stays one argument.
	if i := slices.Index(args, "-append"); args[i+1] != "console=ttyS0 quiet" {
		t.Errorf("-append %q", args[i+1])
	}
}

func TestCappedLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	l, err := openCappedLog(path, 1000, false)
	if err != nil {
		t.Fatal(err)
	}
	// A flood: 1 MiB in odd-sized writes, then one write larger than the cap.
	line := bytes.Repeat([]byte("x"), 333)
	for i := 0; i < 3000; i++ {
		if n, err := l.Write(line); err != nil || n != len(line) {
			t.Fatalf("write: %d, %v", n, err)
		}
	}
	big := append(bytes.Repeat([]byte("y"), 5000), []byte("THE END")...)
	if n, err := l.Write(big); err != nil || n != len(big) {
		t.Fatalf("big write: %d, %v", n, err)
	}
	l.Close()
	var total int64
	for _, p := range []string{path, path + ".1"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 500 {
			t.Errorf("%s holds %d bytes, cap 500", p, st.Size())
		}
		total += st.Size()
	}
	if total > 1000 {
		t.Errorf("the log holds %d bytes, cap 1000", total)
	}
	if tail := logTail(path, 600); !strings.HasSuffix(tail, "yyyTHE END") || len(tail) != 600 {
		t.Errorf("tail %q", tail)
	}
	// Reopened (an adopted VM), it goes on after what it holds.
	l, err = openCappedLog(path, 1000, true)
	if err != nil {
		t.Fatal(err)
	}
	l.Write([]byte("more"))
	l.Close()
	if tail := logTail(path, 11); tail != "THE ENDmore" {
		t.Errorf("tail after reopening %q", tail)
	}
	if err := removeLog(path); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 0 {
		t.Errorf("left: %v", ents)
	}
}
