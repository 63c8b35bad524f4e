package setup

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// SandboxConfig is what the node hands a container sandbox's first
// process (dsec-guest sandbox) through a pipe on fd 3. The process reads
// it only after the node has placed it in its cgroups, so the read is
// also the start signal.
type SandboxConfig struct {
	// Rootfs is where the sandbox's root is built: an empty directory
	// the root is attached on (RootFD) or, without RootFD, a mount in the
	// host's table, which the new mount namespace starts as a copy of.
	Rootfs string `json:"rootfs"`
	// OwnNetwork: the process was cloned into a network namespace of its
	// own (CLONE_NEWNET with its user namespace): a sandbox without any
	// network access has only its loopback interface, which the setup
	// brings up after setting NetSysctls (paths under /proc/sys/net and
	// values: those the node sets in the namespaces it makes).
	OwnNetwork bool        `json:"own_network,omitempty"`
	NetSysctls [][2]string `json:"net_sysctls,omitempty"`
	// RootFD, if not 0, is a descriptor of the root: a detached mount of
	// the overlay the node built (see sys.CloneMount), which never enters
	// the host's mount table.
	RootFD int `json:"root_fd,omitempty"`
	// SockDir is a host-only directory: the agent listens on
	// SockDir/agent.sock, created before pivot_root, after which the
	// directory is out of the sandbox's reach.
	SockDir  string `json:"sock_dir"`
	Hostname string `json:"hostname"`
	// Hosts and ResolvConf become /etc/hosts and /etc/resolv.conf.
	Hosts      string `json:"hosts"`
	ResolvConf string `json:"resolv_conf"`
	// Seccomp is the compiled filter (raw struct sock_filter entries),
	// installed on the agent and so inherited by every process. It
	// travels after the JSON, raw (see Encode).
	Seccomp []byte `json:"-"`
	// KeepCaps are the capability numbers commands keep; all others are
	// dropped from the bounding set (commands run as root get only these).
	KeepCaps []int `json:"keep_caps"`
	// Env is the default environment of commands.
	Env []string `json:"env"`
	// ShmBytes sizes /dev/shm.
	ShmBytes int64 `json:"shm_bytes"`
	// Deferred: the root comes later. The process sets up what needs no
	// root, then waits for a root message (RootMessage) with Rootfs,
	// SockDir (its sandbox directory was renamed), Hostname, Hosts, ResolvConf, Env, ShmBytes and the root's
	// descriptor: a warm agent, started before the image it will run is
	// known (RootFD is then 0).
	Deferred bool `json:"deferred,omitempty"`
}

// Encode is how the node writes c on the config pipe: the JSON of
// everything but the filter, a newline, then the filter's bytes. The
// filter is most of the config (~3 KiB); in JSON it was base64 the
// agent decoded byte by byte in every start.
func (c SandboxConfig) Encode() ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return append(append(b, '\n'), c.Seccomp...), nil
}

// DecodeSandboxConfig reads what Encode wrote.
func DecodeSandboxConfig(b []byte) (SandboxConfig, error) {
	var c SandboxConfig
	js, filter, ok := bytes.Cut(b, []byte{'\n'})
	if !ok {
		return c, errors.New("no end to the config's JSON")
	}
	if err := json.Unmarshal(js, &c); err != nil {
		return c, err
	}
	if len(filter) > 0 {
		c.Seccomp = filter
	}
	return c, nil
}

// SockName is the agent socket's name in SandboxConfig.SockDir.
const SockName = "agent.sock"

// Ready is what `dsec-guest sandbox` writes on its sync pipe (fd 4) once
// its agent listens; anything else written there is its setup error.
const Ready = "ready"

// ForkThread is the name (comm) of the sandbox agent's thread that sets
// the sandbox up and then forks every command: never the process's main
// thread, its thread group leader, so that the node can move it alone
// into the sandbox's commands memory group (cgroups.CommandsGroup) while
// the agent's own memory stays charged outside it.
const ForkThread = "dsec-fork"

// ZygoteRequest asks `dsec-guest zygote` (see Zygote) to start a
// sandbox's first process: root of its user namespace maps to host ids
// UID and GID, Count of them.
type ZygoteRequest struct {
	UID   int `json:"uid"`
	GID   int `json:"gid"`
	Count int `json:"count"`
	// NewNet clones the process into a new network namespace (owned by
	// its user namespace) instead of the one passed.
	NewNet bool `json:"new_net,omitempty"`
	// Owner, if not 0, is the host uid that owns the new user namespace:
	// the forking thread's effective uid while it clones. The kernel
	// charges per-user counts (inotify instances, message queue bytes…)
	// to a namespace's owner, so one per sandbox gives each a budget of
	// its own (see sys.WithThreadEUID).
	Owner int `json:"owner,omitempty"`
	// Nofile, if not 0, is the process's RLIMIT_NOFILE, soft and hard,
	// set by its forking thread (see StartSandbox).
	Nofile uint64 `json:"nofile,omitempty"`
	// Node, if set, goes into the process's environment as NodeEnv: what
	// a restarted node finds the processes it forked by, whether or not
	// they ever joined their cgroups.
	Node string `json:"node,omitempty"`
}

// NodeEnv names the environment variable of a sandbox's first process
// that says which node forked it (ZygoteRequest.Node). Commands never
// see the agent's environment.
const NodeEnv = "DSEC_NODE"

// ZygoteReply is the zygote's answer: the process's pid, or why none.
// With a pid comes the process's pidfd, as the message's only
// descriptor (none from a zygote too old to send one).
type ZygoteReply struct {
	Pid int    `json:"pid,omitempty"`
	Err string `json:"err,omitempty"`
	// Owner is the owner uid the zygote gave the process's user
	// namespace (0 from a zygote too old to know ZygoteRequest.Owner).
	Owner int `json:"owner,omitempty"`
}

// The descriptors a ZygoteRequest carries, in order.
const (
	ZygoteFDNetns   = iota // the sandbox's network namespace, joined for the fork
	ZygoteFDConsole        // its stdout and stderr
	ZygoteFDConfig         // fd 3 in the sandbox (SandboxConfig)
	ZygoteFDSync           // fd 4
	ZygoteFDConn           // fd 5, the node's first connection
	ZygoteFDRoot           // fd 6, SandboxConfig.RootFD
	ZygoteFDBinary         // fd 7, dsec-guest itself
	ZygoteFDs              // how many
)

// Waiting is the byte a deferred setup writes on the node's first
// connection once it waits for its root.
const Waiting = 'w'

// maxRootMessage bounds a root message's JSON.
const maxRootMessage = 1 << 20

// RootMessage is what the node sends a deferred setup (one waiting for
// its root, SandboxConfig.Deferred) on its first connection when a create
// claims it: the length of the JSON of the config's per-sandbox fields
// (4 bytes, big-endian), then that JSON; the first byte carries the
// root's descriptor (SCM_RIGHTS).
func RootMessage(c SandboxConfig) ([]byte, error) {
	js, err := json.Marshal(rootFields{Rootfs: c.Rootfs, SockDir: c.SockDir, Hostname: c.Hostname, Hosts: c.Hosts, ResolvConf: c.ResolvConf, Env: c.Env, ShmBytes: c.ShmBytes})
	if err != nil {
		return nil, err
	}
	b := binary.BigEndian.AppendUint32(nil, uint32(len(js)))
	return append(b, js...), nil
}

// rootFields are the fields a root message sets.
type rootFields struct {
	Rootfs     string   `json:"rootfs"`
	SockDir    string   `json:"sock_dir"`
	Hostname   string   `json:"hostname"`
	Hosts      string   `json:"hosts"`
	ResolvConf string   `json:"resolv_conf"`
	Env        []string `json:"env"`
	ShmBytes   int64    `json:"shm_bytes"`
}

// takeRoot sets c's per-sandbox fields from a root message's JSON.
func (c *SandboxConfig) takeRoot(js []byte) error {
	var f rootFields
	if err := json.Unmarshal(js, &f); err != nil {
		return fmt.Errorf("decoding the root message: %w", err)
	}
	if f.Rootfs == "" || f.SockDir == "" {
		return errors.New("the root message names no root or no socket directory")
	}
	c.Rootfs, c.SockDir, c.Hostname, c.Hosts, c.ResolvConf, c.Env, c.ShmBytes = f.Rootfs, f.SockDir, f.Hostname, f.Hosts, f.ResolvConf, f.Env, f.ShmBytes
	return nil
}
