package setup

import (
	"bytes"
	"slices"
	"testing"
)

// TestSandboxConfigRoundTrip checks that the config survives the pipe's
// encoding, a filter holding newlines and a config string holding one
// included, and that a filterless config stays filterless.
func TestSandboxConfigRoundTrip(t *testing.T) {
	in := SandboxConfig{
		Rootfs: "/r", Hosts: "127.0.0.1 localhost\n::1 localhost\n", Hostname: "h",
		KeepCaps: []int{10}, Env: []string{"A=b"}, ShmBytes: 1 << 20,
		Seccomp: []byte{0x20, '\n', 0, 0, '\n', 0xff},
	}
	b, err := in.Encode()
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeSandboxConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Seccomp, in.Seccomp) || out.Hosts != in.Hosts || out.Rootfs != in.Rootfs ||
		!slices.Equal(out.KeepCaps, in.KeepCaps) || out.ShmBytes != in.ShmBytes {
		t.Errorf("decoded %+v, want %+v", out, in)
	}
	in.Seccomp = nil
	b, _ = in.Encode()
	if out, err := DecodeSandboxConfig(b); err != nil || out.Seccomp != nil {
		t.Errorf("without a filter: %v, filter %v", err, out.Seccomp)
	}
	if _, err := DecodeSandboxConfig([]byte(`{"rootfs":"/r"}`)); err == nil {
		t.Error("a config without its end decoded")
	}
}
