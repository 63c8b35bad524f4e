// Package config is DSec's daemon configuration: a versioned TOML file,
// DSEC_* environment variables over it, and command-line flags over both.
// Zero values are valid: `dsec up` runs on the defaults alone.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// CurrentVersion is the config file format version this build reads.
const CurrentVersion = 1

// Config is the daemon configuration.
type Config struct {
	Version int    `toml:"version"`
	DataDir string `toml:"data_dir"`
	// KeepSandboxes leaves sandboxes running on shutdown (they are
	// re-adopted on the next start).
	KeepSandboxes bool   `toml:"keep_sandboxes"`
	LogLevel      string `toml:"log_level"`
	LogFormat     string `toml:"log_format"` // "text" or "json"

	API  API  `toml:"api"`
	NATS NATS `toml:"nats"`
	Node Node `toml:"node"`
	// Container configures the container tier.
	Container Container `toml:"container"`
	// MicroVM configures the microvm tier.
	MicroVM MicroVM `toml:"microvm"`
	// VM configures the vm tier.
	VM           VM           `toml:"vm"`
	Images       Images       `toml:"images"`
	Limits       Limits       `toml:"limits"`
	Audit        Audit        `toml:"audit"`
	Trajectories Trajectories `toml:"trajectories"`
}

// Audit configures the node's eBPF monitor of sandboxes.
type Audit struct {
	// Disabled runs without the monitor (it also runs without one where
	// its programs cannot load).
	Disabled bool `toml:"disabled"`
	// Rules is a JSON file of rules added to the defaults (a rule named
	// like a default one replaces it).
	Rules string `toml:"rules"`
}

// Images configures where layers live and the built-in images.
type Images struct {
	// Blobs is where layer files are stored: "nats" (the default: a
	// JetStream object store every node reaches) or "local" (a directory
	// in the data dir, for one host).
	Blobs string `toml:"blobs"`
	// BuiltinCache keeps built-in layer builds (default <data_dir>/builtin).
	BuiltinCache string `toml:"builtin_cache"`
	// SkipSlow leaves out built-in images that take minutes to build
	// (base/debian-12).
	SkipSlow bool `toml:"skip_slow"`
	// LayerCacheBytes bounds the node's cache of layer files (20 GiB).
	LayerCacheBytes int64 `toml:"layer_cache_bytes"`
	// Lazy loads layers on demand: a node keeps a layer's metadata and
	// chunk index and fetches the data chunks its sandboxes read, on
	// first read (off by default: a node restart does not yet keep
	// lazily loaded sandboxes reading; docs/design/images.md).
	Lazy bool `toml:"lazy"`
	// LazyFetchTimeoutS bounds one chunk's fetch; a read past it fails
	// with EIO in the sandbox (default 30).
	LazyFetchTimeoutS int `toml:"lazy_fetch_timeout_s"`
	// ChunkCacheBytes bounds the node's cache of lazily loaded chunks on
	// disk (0: 20 GiB); past it, clean chunks are evicted.
	ChunkCacheBytes int64 `toml:"chunk_cache_bytes"`
}

// API configures the REST server.
type API struct {
	Listen         string `toml:"listen"`
	MaxBodyBytes   int64  `toml:"max_body_bytes"`
	MaxFileBytes   int64  `toml:"max_file_bytes"`
	AllowDirImages *bool  `toml:"allow_dir_images"`
	// ShutdownGrace bounds how long in-flight requests may take to finish.
	ShutdownGrace Duration `toml:"shutdown_grace"`
	// DebugListen, if set, serves Go's pprof handlers there (keep it on
	// loopback: they are not authenticated).
	DebugListen string `toml:"debug_listen"`
}

// NATS configures the message bus.
type NATS struct {
	// URL of an external NATS server (dsec server / dsec node). Empty for
	// `dsec up`, which embeds one.
	URL string `toml:"url"`
	// Listen is where the embedded server accepts other nodes; "none"
	// disables the listener.
	Listen string `toml:"listen"`
	// Token authenticates to NATS. The embedded server creates one in the
	// data directory if unset.
	Token string `toml:"token"`
	// ServerName names this API server among the others, and its
	// embedded NATS server in a cluster (default: the host name). Names
	// must be unique: a server's creates and leadership are leased
	// under it.
	ServerName string `toml:"server_name"`
	// ClusterName, for dsec server, makes the embedded NATS server a
	// member of that NATS cluster (instead of dialling URL): routes are
	// accepted at ClusterListen, the other members are at Routes
	// (host:port), and JetStream is replicated across the members.
	ClusterName   string   `toml:"cluster_name"`
	ClusterListen string   `toml:"cluster_listen"`
	Routes        []string `toml:"routes"`
	// Replicas of every JetStream bucket and stream a server opens
	// (default: 3 in a cluster, 1 alone; with an external NATS, what
	// the buckets already have, or 1).
	Replicas int `toml:"replicas"`
}

// Clustered reports whether the embedded NATS server joins a cluster.
func (n NATS) Clustered() bool { return n.ClusterName != "" }

// StreamReplicas is the replica count buckets and streams are opened
// with (0: keep what they have; see NATS.Replicas).
func (n NATS) StreamReplicas() int {
	switch {
	case n.Replicas > 0:
		return n.Replicas
	case n.Clustered():
		return 3
	case n.URL == "":
		return 1
	}
	return 0
}

// MaxHollow caps the hollow nodes of one process.
const MaxHollow = 10000

// Node configures the node service.
type Node struct {
	ID           string `toml:"id"`
	MaxSandboxes int    `toml:"max_sandboxes"`
	// FunctionPoolSize is the number of pre-instantiated modules kept per
	// WebAssembly module.
	FunctionPoolSize int `toml:"function_pool_size"`
	// FunctionCacheDir keeps compiled WebAssembly modules (default
	// <data_dir>/cache/wasm). Daemons on one host may share it: entries
	// are written whole and renamed into place.
	FunctionCacheDir string `toml:"function_cache_dir"`
	// MaxStarts is how many creates of a tier the node runs at once
	// (default per tier: 4 per CPU for containers, 8 per CPU for
	// functions, 1 per CPU for VMs); StartQueue caps the creates waiting
	// for their turn (4096) and StartWaitS how long one may wait (10 s).
	// Past them a create is refused with 429 overloaded and Retry-After.
	MaxStarts  int `toml:"max_starts"`
	StartQueue int `toml:"start_queue"`
	StartWaitS int `toml:"start_wait_s"`
	// Hollow, for `dsec node`, runs that many simulated nodes instead of
	// a real one (<id>-h0001 …): they take creates, execs and deletes
	// over the node protocol and make no OS object (internal/hollow).
	Hollow int `toml:"hollow"`
}

// Container configures the container tier of a node. Two daemons on one
// host need distinct names, cgroup parents and disjoint ranges.
type Container struct {
	// Disabled turns the tier off.
	Disabled bool `toml:"disabled"`
	// Name names the node's nftables table, netns files and host veths
	// (default "dsec"; at most 7 letters and digits).
	Name string `toml:"name"`
	// NetworkRange is the IPv4 range sandbox addresses come from (default
	// 10.88.0.0/16).
	NetworkRange string `toml:"network_range"`
	// NetworkPool is how many network namespaces are kept ready (32).
	NetworkPool int `toml:"network_pool"`
	// NetworkReuse returns a destroyed sandbox's network namespace to the
	// pool when nothing of it is left inside (network.Options.Reuse):
	// ~3 ms of CPU less per sandbox, but the next sandbox on the slot can
	// read its predecessors' traffic counters. Off by default.
	NetworkReuse bool `toml:"network_reuse"`
	// WarmPool is how many sandboxes without network access are kept
	// started for each of the last images used (container.Options.Warm):
	// 0 means 2, a negative value none.
	WarmPool int `toml:"warm_pool"`
	// WarmAgents is how many idle agents, bound to any image's root when
	// a create claims one, are kept started (container.Options.WarmAgents):
	// they serve the images without warm sandboxes of their own, a
	// fork's children among them. 0 means 16, a negative value none.
	WarmAgents int `toml:"warm_agents"`
	// Uplinks are the interfaces allowed egress leaves by (default: those
	// of the default routes).
	Uplinks []string `toml:"uplinks"`
	// CgroupParent is the cgroup every sandbox's group is made under
	// (default "dsec").
	CgroupParent string `toml:"cgroup_parent"`
	// IDBase is the host uid and gid a sandbox's root maps to; sandboxes
	// own the 65536 ids from there (default 1000000).
	IDBase int `toml:"id_base"`
}

// MicroVM configures the microvm tier of a node: a QEMU microvm per
// sandbox (internal/vm/vmtier). The tier is registered whenever it is not
// disabled; without QEMU the node reports it unavailable.
type MicroVM struct {
	// Disabled turns the tier off.
	Disabled bool `toml:"disabled"`
	// CacheDir caches the guest kernel (from Debian's linux-image package)
	// and the initramfs built over it (default <data_dir>/cache/vmkernel).
	CacheDir string `toml:"cache_dir"`
	// QEMU is the qemu-system-x86_64 binary (default: the one on PATH).
	QEMU string `toml:"qemu"`
	// Accelerator is "auto" (the default: KVM once the guest kernel is
	// seen booting on it, else TCG), "kvm" or "tcg".
	Accelerator string `toml:"accelerator"`
	// BootTimeoutS bounds a VM's boot to its agent's hello (60); a VM not
	// ready by then is killed and its create fails.
	BootTimeoutS int `toml:"boot_timeout_s"`
	// Unjailed runs QEMU as the node's user in the node's cgroup. By
	// default each QEMU runs as a uid of its own, with no supplementary
	// groups (but /dev/kvm's group on KVM), in a cgroup of its own
	// (vmtier.Jail).
	Unjailed bool `toml:"unjailed"`
	// UIDBase is the first of the 65536 uids (and gids) given to QEMUs,
	// one per VM (default: right after the container tier's range,
	// [container] id_base + 65536; the vm tier takes the next 65536).
	UIDBase int `toml:"uid_base"`
	// MemoryOverheadMiB is added to a VM's memory for its QEMU's cgroup
	// limit (256).
	MemoryOverheadMiB int `toml:"memory_overhead_mib"`
	// Pids is the pids limit of a QEMU's cgroup (256).
	Pids int `toml:"pids"`
	// CgroupParent is the cgroup the tier's QEMU groups are made under
	// (default "dsec-microvm"; the vm tier's [vm] cgroup_parent,
	// "dsec-vm").
	CgroupParent string `toml:"cgroup_parent"`
	// Upper is the kind of a VM's writable layer, in both VM tiers:
	// "disk" (the default: an ext4 disk of the sandbox's disk size, a
	// sparse file in its run directory) or "tmpfs" (a tmpfs of that size
	// in the guest, which counts against the guest's memory).
	Upper string `toml:"upper"`
}

// VM configures the vm tier of a node: a QEMU q35 machine per sandbox
// (SeaBIOS, ACPI, PCI virtio devices), run by the microvm tier's code
// (internal/vm/vmtier with vmm.Q35). It shares [microvm]'s guest kernel,
// QEMU, accelerator and jail settings, and is registered when neither
// tier is disabled.
type VM struct {
	// Disabled turns the tier off.
	Disabled bool `toml:"disabled"`
	// BootTimeoutS bounds a boot through the firmware (90).
	BootTimeoutS int `toml:"boot_timeout_s"`
	// CgroupParent: see MicroVM.CgroupParent (default "dsec-vm").
	CgroupParent string `toml:"cgroup_parent"`
}

// Limits are the control plane's defaults and bounds (see
// controlplane.Limits for the defaults of zero values).
type Limits struct {
	DefaultTimeoutS      int               `toml:"default_timeout_s"`
	MaxTimeoutS          int               `toml:"max_timeout_s"`
	DefaultMemoryMB      int               `toml:"default_memory_mb"`
	DefaultDiskMB        int               `toml:"default_disk_mb"`
	MaxSandboxesPerToken int               `toml:"max_sandboxes_per_token"`
	CreatesPerSecond     float64           `toml:"creates_per_second"`
	CreateBurst          int               `toml:"create_burst"`
	DefaultOutputBytes   int               `toml:"default_output_bytes"`
	Retention            Duration          `toml:"retention"`
	DefaultImages        map[string]string `toml:"default_images"`
	// NodeLost is how long a node may miss heartbeats before its
	// sandboxes are lost (failed, or resumed elsewhere) (90s).
	NodeLost Duration `toml:"node_lost"`
}

// Trajectories configure the trajectory log (docs/design/trajectories.md).
type Trajectories struct {
	// Retention keeps a trajectory's steps, blobs and head (168h).
	Retention Duration `toml:"retention"`
	// MaxBytes caps one trajectory's log and blobs (1 GiB).
	MaxBytes int64 `toml:"max_bytes"`
	// MaxForkCount caps the children of one fork (64).
	MaxForkCount int `toml:"max_fork_count"`
}

// Duration is a time.Duration written as a string ("30s") in TOML.
type Duration struct{ time.Duration }

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	d.Duration = v
	return err
}

// Defaults returns the configuration `dsec up` uses with no file, no
// environment and no flags.
func Defaults() Config {
	host, _ := os.Hostname()
	return Config{
		Version:   CurrentVersion,
		DataDir:   "/var/lib/dsec",
		LogLevel:  "info",
		LogFormat: "text",
		API:       API{Listen: "127.0.0.1:7878", ShutdownGrace: Duration{30 * time.Second}},
		NATS:      NATS{Listen: "127.0.0.1:7422", ServerName: NodeIDFromHost(host)},
		Node:      Node{ID: NodeIDFromHost(host)},
	}
}

// NodeIDFromHost turns a host name into a valid node ID.
func NodeIDFromHost(host string) string {
	var b strings.Builder
	for _, r := range host {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == '.':
			b.WriteRune('-')
		}
		if b.Len() >= 64 {
			break
		}
	}
	if b.Len() == 0 {
		return "node"
	}
	return b.String()
}

// Load reads the file at path over c. A missing file is an error only if
// required (an explicit --config).
func (c *Config) Load(path string, required bool) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !required {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading config: %w", err)
	}
	md, err := toml.Decode(string(b), c)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return fmt.Errorf("config %s: unknown setting %q", path, und[0].String())
	}
	if c.Version != CurrentVersion {
		return fmt.Errorf("config %s: version = %d, this dsec reads version %d", path, c.Version, CurrentVersion)
	}
	return nil
}

// ApplyEnv applies DSEC_* variables over c.
func (c *Config) ApplyEnv(getenv func(string) string) error {
	str := func(name string, dst *string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	str("DSEC_DATA_DIR", &c.DataDir)
	str("DSEC_LISTEN", &c.API.Listen)
	str("DSEC_NATS_URL", &c.NATS.URL)
	str("DSEC_NATS_LISTEN", &c.NATS.Listen)
	str("DSEC_NATS_TOKEN", &c.NATS.Token)
	str("DSEC_SERVER_NAME", &c.NATS.ServerName)
	str("DSEC_CLUSTER_NAME", &c.NATS.ClusterName)
	str("DSEC_CLUSTER_LISTEN", &c.NATS.ClusterListen)
	if v := getenv("DSEC_ROUTES"); v != "" {
		c.NATS.Routes = SplitList(v)
	}
	str("DSEC_NODE_ID", &c.Node.ID)
	str("DSEC_LOG_LEVEL", &c.LogLevel)
	str("DSEC_LOG_FORMAT", &c.LogFormat)
	str("DSEC_DEBUG_LISTEN", &c.API.DebugListen)
	str("DSEC_BLOBS", &c.Images.Blobs)
	str("DSEC_BUILTIN_CACHE", &c.Images.BuiltinCache)
	if v := getenv("DSEC_SKIP_SLOW_IMAGES"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("DSEC_SKIP_SLOW_IMAGES=%q: want true or false", v)
		}
		c.Images.SkipSlow = b
	}
	if v := getenv("DSEC_LAZY_IMAGES"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("DSEC_LAZY_IMAGES=%q: want true or false", v)
		}
		c.Images.Lazy = b
	}
	if v := getenv("DSEC_WARM_AGENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("DSEC_WARM_AGENTS=%q: want a number", v)
		}
		c.Container.WarmAgents = n
	}
	if v := getenv("DSEC_KEEP_SANDBOXES"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("DSEC_KEEP_SANDBOXES=%q: want true or false", v)
		}
		c.KeepSandboxes = b
	}
	return nil
}

// Validate checks the settings that have no safe fallback.
func (c *Config) Validate() error {
	if c.DataDir == "" {
		return errors.New("data_dir is empty")
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return fmt.Errorf("log_format %q: want text or json", c.LogFormat)
	}
	switch c.MicroVM.Accelerator {
	case "", "auto", "kvm", "tcg":
	default:
		return fmt.Errorf("microvm.accelerator %q: want auto, kvm or tcg", c.MicroVM.Accelerator)
	}
	switch c.MicroVM.Upper {
	case "", "disk", "tmpfs":
	default:
		return fmt.Errorf("microvm.upper %q: want disk or tmpfs", c.MicroVM.Upper)
	}
	if c.MicroVM.BootTimeoutS < 0 {
		return fmt.Errorf("microvm.boot_timeout_s %d: want a positive number of seconds", c.MicroVM.BootTimeoutS)
	}
	if c.VM.BootTimeoutS < 0 {
		return fmt.Errorf("vm.boot_timeout_s %d: want a positive number of seconds", c.VM.BootTimeoutS)
	}
	if c.Node.MaxStarts < 0 || c.Node.StartQueue < 0 || c.Node.StartWaitS < 0 {
		return errors.New("node.max_starts, start_queue and start_wait_s: want positive numbers (0: the default)")
	}
	if c.MicroVM.UIDBase < 0 || c.MicroVM.MemoryOverheadMiB < 0 || c.MicroVM.Pids < 0 {
		return errors.New("microvm.uid_base, memory_overhead_mib and pids: want positive numbers")
	}
	if c.Node.Hollow < 0 || c.Node.Hollow > MaxHollow {
		return fmt.Errorf("node.hollow %d: want 0 to %d simulated nodes", c.Node.Hollow, MaxHollow)
	}
	if c.Images.ChunkCacheBytes < 0 {
		return fmt.Errorf("images.chunk_cache_bytes %d: want a positive number of bytes (0: 20 GiB)", c.Images.ChunkCacheBytes)
	}
	if c.Images.LazyFetchTimeoutS < 0 {
		return fmt.Errorf("images.lazy_fetch_timeout_s %d: want a positive number of seconds", c.Images.LazyFetchTimeoutS)
	}
	if err := c.NATS.validate(); err != nil {
		return err
	}
	switch c.Images.Blobs {
	case "", "local", "nats":
	default:
		return fmt.Errorf("images.blobs %q: want local or nats", c.Images.Blobs)
	}
	return nil
}

func (n NATS) validate() error {
	if n.ServerName != "" && !serverName.MatchString(n.ServerName) {
		return fmt.Errorf("nats.server_name %q: want 1 to 64 letters, digits, '-' or '_'", n.ServerName)
	}
	if n.Replicas < 0 || n.Replicas > 5 {
		return fmt.Errorf("nats.replicas %d: want 1 to 5 (0: the default)", n.Replicas)
	}
	if !n.Clustered() {
		if n.ClusterListen != "" || len(n.Routes) > 0 {
			return errors.New("nats.cluster_listen and nats.routes need nats.cluster_name")
		}
		return nil
	}
	if n.URL != "" {
		return errors.New("nats.cluster_name and nats.url: a server either runs a cluster member or dials NATS, not both")
	}
	if n.ClusterListen == "" {
		return errors.New("nats.cluster_name needs nats.cluster_listen (host:port the other members route to)")
	}
	return nil
}

var serverName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// SplitList splits a comma-separated list, dropping empty items and
// spaces around them.
func SplitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
