package container

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
)

// hostname is a sandbox's host name: its ID, cut to the 63 bytes a label
// may have.
func hostname(id string) string {
	if len(id) > 63 {
		return id[:63]
	}
	return id
}

func hostsFile(id string, ep *network.Endpoint) string {
	var b strings.Builder
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	if ep.Addr.IsValid() {
		fmt.Fprintf(&b, "%s\t%s\n", ep.Addr, hostname(id))
	} else {
		fmt.Fprintf(&b, "127.0.1.1\t%s\n", hostname(id))
	}
	// The names of the policy's allow rules, as the node resolved them:
	// what the firewall allows is what the sandbox connects to.
	for _, name := range slices.Sorted(maps.Keys(ep.Hosts)) {
		for _, a := range ep.Hosts[name] {
			fmt.Fprintf(&b, "%s\t%s\n", a, name)
		}
	}
	return b.String()
}

// resolvConf names the resolvers the node allows; with none, the file
// says so (a sandbox without egress resolves nothing).
func resolvConf(ep *network.Endpoint) string {
	if len(ep.DNS) == 0 {
		return "# no resolver: this sandbox has no network egress\n"
	}
	var b strings.Builder
	for _, a := range ep.DNS {
		fmt.Fprintf(&b, "nameserver %s\n", a)
	}
	b.WriteString("options timeout:2 attempts:2\n")
	return b.String()
}

// baseEnv is the agent's environment for every command, the same in
// every sandbox (so that a warm one serves any): the usual variables.
func baseEnv() []string {
	return []string{
		"HOME=/root",
		"LANG=C.UTF-8",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"TERM=xterm",
	}
}

// commandEnv is what the node sends with each command of the sandbox
// spec: the sandbox's variables (its HOSTNAME, then its spec's) under the
// request's own, over the agent's baseEnv.
func commandEnv(spec sandbox.Spec, req map[string]string) map[string]string {
	env := map[string]string{"HOSTNAME": hostname(spec.ID)}
	maps.Copy(env, spec.Env)
	maps.Copy(env, req)
	return env
}
