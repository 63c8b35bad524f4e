// Package vmconfig is the configuration the node gives a microVM guest:
// the node's microvm runtime writes it, JSON padded with NULs to a whole
// number of sectors, to a small raw disk with serial DiskSerial, and the
// guest init (internal/guest/vminit) reads it back from /dev/vd* before it
// assembles the guest's root. It has no dependencies beyond the standard
// library so that both sides can import it.
package vmconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// DiskSerial is the virtio-blk serial of the config disk.
const DiskSerial = "dsec-config"

// UpperSerial is the virtio-blk serial the node gives an upper disk
// (Config.UpperDisk).
const UpperSerial = "dsec-upper"

// MaxSize bounds the config disk: the guest reads at most this much.
const MaxSize = 1 << 20

// sector is the config disk's size unit.
const sector = 512

// Config is one VM's configuration.
type Config struct {
	// Layers are the image's layers, bottom first.
	Layers []Layer `json:"layers"`
	// UpperMiB is the size of the writable upper layer.
	UpperMiB int `json:"upper_mib"`
	// UpperDisk, if set, is the serial of the upper layer's disk: a
	// writable virtio-blk disk of UpperMiB holding an empty ext4 file
	// system. Without it the upper layer is a tmpfs of UpperMiB in the
	// guest, and what is written counts against the guest's memory.
	UpperDisk string `json:"upper_disk,omitempty"`
	// Hostname is the guest's host name.
	Hostname string `json:"hostname,omitempty"`
	// Env is the environment of every command (NAME=value), under the
	// request's own.
	Env []string `json:"env,omitempty"`
	// Hosts and Resolv, if set, replace the root's /etc/hosts and
	// /etc/resolv.conf.
	Hosts  string `json:"hosts,omitempty"`
	Resolv string `json:"resolv,omitempty"`
	// Init lets the image's init system (/sbin/init, if it is systemd)
	// run as PID 1, with the agent as a process beside it (the vm tier);
	// otherwise the agent is PID 1.
	Init bool `json:"init,omitempty"`
	// Net, if set, configures the guest's virtio-net interface; without
	// it the guest has only its loopback interface.
	Net *Net `json:"net,omitempty"`
}

// Net is the guest's network, routed as a container sandbox's (see
// internal/network): its address as a /32, a default route through a
// link-local gateway, and a permanent neighbour entry for the gateway,
// so that the guest never needs ARP. IPv6 is disabled.
type Net struct {
	// Addr is the guest's IPv4 address.
	Addr string `json:"addr"`
	// MAC is the address QEMU gives the NIC: the guest configures the
	// interface that has it.
	MAC string `json:"mac"`
	// Gateway and GatewayMAC are the default gateway's addresses.
	Gateway    string `json:"gateway"`
	GatewayMAC string `json:"gateway_mac"`
	// MTU of the interface (the kernel's default if zero).
	MTU int `json:"mtu,omitempty"`
}

// Layer names a layer's two disks by their virtio-blk serials: its EROFS
// metadata image and its blob (EROFS's extra device).
type Layer struct {
	Meta string `json:"meta"`
	Blob string `json:"blob"`
}

// LayerSerials returns the serials of layer i's disks, "l<i>m" and "l<i>b".
func LayerSerials(i int) (meta, blob string) {
	s := "l" + strconv.Itoa(i)
	return s + "m", s + "b"
}

// Encode returns c as the config disk's content: JSON padded with NULs to
// a whole number of 512-byte sectors.
func (c *Config) Encode() ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	n := (len(b) + sector) / sector * sector // at least one NUL
	if n > MaxSize {
		return nil, fmt.Errorf("vm config of %d bytes: at most %d", len(b), MaxSize-1)
	}
	return append(b, make([]byte, n-len(b))...), nil
}

// Decode parses a config disk's content: JSON up to the first NUL.
func Decode(b []byte) (*Config, error) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return nil, errors.New("vm config: no NUL after the JSON (truncated?)")
	}
	var c Config
	if err := json.Unmarshal(b[:i], &c); err != nil {
		return nil, fmt.Errorf("vm config: %w", err)
	}
	if len(c.Layers) == 0 {
		return nil, errors.New("vm config: no layers")
	}
	if c.UpperMiB <= 0 {
		return nil, fmt.Errorf("vm config: upper size %d MiB", c.UpperMiB)
	}
	return &c, nil
}
