package agentsandbox

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// Hostname is a sandbox's host name: its ID, cut to the 63 bytes a label
// may have.
func Hostname(id string) string {
	if len(id) > 63 {
		return id[:63]
	}
	return id
}

// HostsFile is sandbox id's /etc/hosts: its own name on its address (or
// 127.0.1.1 without one: ep nil, or without an address) and the names of
// its policy's allow rules, as the node resolved them (what the firewall
// allows is what the sandbox connects to).
func HostsFile(id string, ep *network.Endpoint) string {
	var b strings.Builder
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	if ep != nil && ep.Addr.IsValid() {
		fmt.Fprintf(&b, "%s\t%s\n", ep.Addr, Hostname(id))
	} else {
		fmt.Fprintf(&b, "127.0.1.1\t%s\n", Hostname(id))
	}
	if ep != nil {
		for _, name := range slices.Sorted(maps.Keys(ep.Hosts)) {
			for _, a := range ep.Hosts[name] {
				fmt.Fprintf(&b, "%s\t%s\n", a, name)
			}
		}
	}
	return b.String()
}

// ResolvConf is a sandbox's /etc/resolv.conf: the resolvers the node
// allows (ep's); with none, the file says so (a sandbox without egress
// resolves nothing).
func ResolvConf(ep *network.Endpoint) string {
	if ep == nil || len(ep.DNS) == 0 {
		return "# no resolver: this sandbox has no network egress\n"
	}
	var b strings.Builder
	for _, a := range ep.DNS {
		fmt.Fprintf(&b, "nameserver %s\n", a)
	}
	b.WriteString("options timeout:2 attempts:2\n")
	return b.String()
}

// baseEnv are the usual variables every command has.
var baseEnv = map[string]string{
	"HOME": "/root",
	"LANG": "C.UTF-8",
	"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"TERM": "xterm",
}

// BaseEnv is the agent's environment for every command (its
// Options.DefaultEnv), as NAME=value sorted by name: the usual variables
// with over's set over them. A container's agent has the usual ones
// alone, the same in every sandbox so that a warm one serves any, and is
// sent the sandbox's with each command (CommandEnv); a VM's guest, made
// for one sandbox, has them built in.
func BaseEnv(over map[string]string) []string {
	env := maps.Clone(baseEnv)
	maps.Copy(env, over)
	var out []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// CommandEnv is a sandbox's own variables for a command, set over the
// agent's BaseEnv: its HOSTNAME, then its spec's, then the request's
// (req).
func CommandEnv(spec sandbox.Spec, req map[string]string) map[string]string {
	env := map[string]string{"HOSTNAME": Hostname(spec.ID)}
	maps.Copy(env, spec.Env)
	maps.Copy(env, req)
	return env
}
