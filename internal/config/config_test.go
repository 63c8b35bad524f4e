package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPrecedenceFileThenEnv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dsec.toml")
	os.WriteFile(path, []byte(`version = 1
data_dir = "/from/file"
[api]
listen = "127.0.0.1:1"
[limits]
creates_per_second = 50.5
retention = "2m"
`), 0o644)
	c := Defaults()
	if err := c.Load(path, true); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DSEC_DATA_DIR": "/from/env", "DSEC_KEEP_SANDBOXES": "true", "DSEC_WARM_AGENTS": "-1"}
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if c.DataDir != "/from/env" || c.API.Listen != "127.0.0.1:1" || !c.KeepSandboxes || c.Container.WarmAgents != -1 ||
		c.Limits.CreatesPerSecond != 50.5 || c.Limits.Retention.Minutes() != 2 {
		t.Errorf("config = %+v", c)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "c.toml")
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	tests := []struct{ name, body, want string }{
		{"wrong version", "version = 2\n", "version"},
		{"unknown key", "version = 1\nbogus = 1\n", "unknown setting"},
		{"bad toml", "version = \n", "config"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Defaults()
			err := c.Load(write(tt.body), true)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load = %v, want error containing %q", err, tt.want)
			}
		})
	}
	c := Defaults()
	if err := c.Load(filepath.Join(dir, "missing.toml"), false); err != nil {
		t.Errorf("optional missing file: %v", err)
	}
	if err := c.Load(filepath.Join(dir, "missing.toml"), true); err == nil {
		t.Error("required missing file accepted")
	}
	if err := c.ApplyEnv(func(k string) string { return map[string]string{"DSEC_KEEP_SANDBOXES": "maybe"}[k] }); err == nil {
		t.Error("bad bool accepted")
	}
	if err := c.ApplyEnv(func(k string) string { return map[string]string{"DSEC_WARM_AGENTS": "many"}[k] }); err == nil {
		t.Error("bad number accepted")
	}
}

func TestNodeIDFromHost(t *testing.T) {
	for in, want := range map[string]string{"host.example.com": "host-example-com", "": "node", "a b": "ab"} {
		if got := NodeIDFromHost(in); got != want {
			t.Errorf("NodeIDFromHost(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMicroVMSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dsec.toml")
	os.WriteFile(path, []byte(`version = 1
[microvm]
cache_dir = "/var/cache/dsec-vm"
qemu = "/opt/qemu/bin/qemu-system-x86_64"
accelerator = "tcg"
boot_timeout_s = 20
upper = "tmpfs"
`), 0o644)
	c := Defaults()
	if err := c.Load(path, true); err != nil {
		t.Fatal(err)
	}
	want := MicroVM{CacheDir: "/var/cache/dsec-vm", QEMU: "/opt/qemu/bin/qemu-system-x86_64", Accelerator: "tcg", BootTimeoutS: 20, Upper: "tmpfs"}
	if c.MicroVM != want {
		t.Errorf("[microvm] = %+v, want %+v", c.MicroVM, want)
	}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
	if d := Defaults(); d.MicroVM.Disabled || d.Validate() != nil {
		t.Errorf("defaults: microvm disabled %v, validate %v", d.MicroVM.Disabled, d.Validate())
	}
	c.MicroVM.Upper = "ramdisk"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "upper") {
		t.Errorf("upper ramdisk: Validate = %v", err)
	}
	c.MicroVM.Upper = ""
	c.MicroVM.Accelerator = "hvf"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "accelerator") {
		t.Errorf("accelerator hvf: Validate = %v", err)
	}
}

// TestClusterSettings: a cluster member needs a route address and no
// external URL; replicas default to 3 in a cluster, 1 alone, and to
// "keep" with an external NATS.
func TestClusterSettings(t *testing.T) {
	for name, n := range map[string]NATS{
		"no listen":         {ClusterName: "c"},
		"url and cluster":   {ClusterName: "c", ClusterListen: ":6222", URL: "nats://x:4222"},
		"routes alone":      {Routes: []string{"a:6222"}},
		"too many replicas": {Replicas: 7},
		"bad server name":   {ServerName: "a b"},
	} {
		c := Defaults()
		c.NATS = n
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c := Defaults()
	c.NATS = NATS{ClusterName: "c", ClusterListen: ":6222", Routes: []string{"a:6222", "b:6222"}, ServerName: "s1"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		n    NATS
		want int
	}{
		{c.NATS, 3},
		{NATS{}, 1},
		{NATS{URL: "nats://x:4222"}, 0},
		{NATS{URL: "nats://x:4222", Replicas: 3}, 3},
	} {
		if got := tc.n.StreamReplicas(); got != tc.want {
			t.Errorf("StreamReplicas of %+v = %d, want %d", tc.n, got, tc.want)
		}
	}
	env := map[string]string{"DSEC_ROUTES": "a:1, b:2,,", "DSEC_CLUSTER_NAME": "c", "DSEC_SERVER_NAME": "s9"}
	c = Defaults()
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if len(c.NATS.Routes) != 2 || c.NATS.Routes[1] != "b:2" || c.NATS.ClusterName != "c" || c.NATS.ServerName != "s9" {
		t.Errorf("from the environment: %+v", c.NATS)
	}
}
