package vminit

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestCmdlineParam(t *testing.T) {
	tests := []struct {
		name, cmdline, param, want string
		ok                         bool
	}{
		{"present", "console=ttyS0 quiet dsec.test=poweroff panic=-1", TestParam, "poweroff", true},
		{"absent", "console=ttyS0 quiet", TestParam, "", false},
		{"bare", "quiet\n", "quiet", "", true},
		{"prefix only", "dsec.testing=1", TestParam, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := cmdlineParam(tt.cmdline, tt.param)
			if got != tt.want || ok != tt.ok {
				t.Errorf("cmdlineParam(%q, %q) = %q, %v; want %q, %v", tt.cmdline, tt.param, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestParseModulesList(t *testing.T) {
	got := parseModulesList("# load order\n/lib/modules/a.ko\n\n  /lib/modules/b.ko  \n")
	if diff := cmp.Diff([]string{"/lib/modules/a.ko", "/lib/modules/b.ko"}, got); diff != "" {
		t.Error(diff)
	}
}

func TestReadyLine(t *testing.T) {
	got := readyLine("v1", 1500*time.Millisecond, 130*time.Millisecond, 12)
	want := "DSEC-READY version=v1 uptime=1.500s modules=12/130ms"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestRunRefusesOutsidePID1(t *testing.T) {
	if err := Run("test"); err == nil {
		t.Fatal("Run outside PID 1 returned nil")
	}
}

func TestModuleName(t *testing.T) {
	for p, want := range map[string]string{
		"/lib/modules/6.1.0-57-amd64/virtio_net.ko": "virtio_net",
		"net_failover.ko":      "net_failover",
		"/a/crc32c-generic.ko": "crc32c_generic",
	} {
		if got := moduleName(p); got != want {
			t.Errorf("moduleName(%q) = %q, want %q", p, got, want)
		}
	}
}
