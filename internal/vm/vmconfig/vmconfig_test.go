package vmconfig

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEncodeDecode(t *testing.T) {
	m, b := LayerSerials(0)
	c := &Config{Layers: []Layer{{Meta: m, Blob: b}}, UpperMiB: 64, Hostname: "sb", Env: []string{"A=1"},
		Net: &Net{Addr: "10.88.0.2", MAC: "0a:58:0a:58:00:02", Gateway: "169.254.1.1", GatewayMAC: "ee:ee:ee:ee:ee:ee", MTU: 1500}}
	enc, err := c.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if len(enc)%512 != 0 || enc[len(enc)-1] != 0 {
		t.Fatalf("encoded config is %d bytes, last %#x: want whole sectors of NUL padding", len(enc), enc[len(enc)-1])
	}
	got, err := Decode(append(enc, make([]byte, 4096)...)) // a disk rounded up further
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c, got); diff != "" {
		t.Error(diff)
	}
	if m != "l0m" || b != "l0b" {
		t.Errorf("LayerSerials(0) = %q, %q", m, b)
	}
}

func TestDecodeRejects(t *testing.T) {
	for name, in := range map[string]string{
		"no NUL":    `{"layers":[{"meta":"l0m","blob":"l0b"}],"upper_mib":1}`,
		"no layers": `{"upper_mib":1}` + "\x00",
		"no upper":  `{"layers":[{"meta":"l0m","blob":"l0b"}]}` + "\x00",
		"garbage":   "{\x00",
	} {
		if _, err := Decode([]byte(in)); err == nil {
			t.Errorf("%s: Decode succeeded", name)
		}
	}
}
