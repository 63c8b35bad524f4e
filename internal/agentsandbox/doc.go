// Package agentsandbox is the node's side of the tiers whose sandboxes
// run the in-sandbox agent (dsec-guest: internal/guest/agent) and are driven
// over its protocol (internal/guest/agentproto): the container tier
// (internal/container) and the VM tiers (internal/vm/vmtier, which runs
// both microvm and vm). How a sandbox is made and watched differs between
// them (namespaces and cgroups on the host, or a QEMU guest); what the
// node does through the agent does not, and is here once:
//
//   - the files the sandbox's setup writes (/etc/hostname, /etc/hosts,
//     /etc/resolv.conf: Hostname, HostsFile, ResolvConf) and the
//     commands' environment (BaseEnv, CommandEnv);
//   - connecting to the agent and greeting it (Dial);
//   - the sandbox API the agent serves (Agent): exec, background
//     processes and terminals (Process), the files API, each command with
//     its phase's user and capabilities (Agent.Command), and what a tier
//     offers with them (Capabilities);
//   - telling the node of a sandbox that ended by itself (Ends).
//
// It exists so that a change to what the agent does for a sandbox (a new
// exec option, a file operation, a snapshot) is made in one place and
// reaches every agent-backed tier alike. What is a tier's own stays in the
// tier: starting and stopping the sandbox, noticing its end, applying a
// phase, and measuring it.
package agentsandbox
