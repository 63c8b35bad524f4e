package guard

import (
	"net/netip"
	"path/filepath"
)

// Options are what Attach refuses and where it pins; the zero value
// refuses no destination (devices and raw sockets still) and pins
// nothing.
type Options struct {
	// Deny are the destinations refused (DefaultDeny for a node).
	Deny []netip.Prefix
	// DNS are the resolvers allowed on port 53 even inside Deny (IPv4
	// only; others are ignored).
	DNS []netip.Addr
	// PinDir is a directory on the BPF file system (PinDir(name)) where
	// the links are pinned, so that they outlive the process; "" keeps
	// them for as long as the Guard only.
	PinDir string
}

// bpffs is where the node mounts the BPF file system if nothing is
// mounted there.
const bpffs = "/sys/fs/bpf"

// PinRoot holds the pin directories of the node services on the host.
const PinRoot = bpffs + "/dsec"

// PinDir is the pin directory of the node service instance name (its
// container tier's network name, which one agent at a time holds).
func PinDir(name string) string { return filepath.Join(PinRoot, name) }
