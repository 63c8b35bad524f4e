// Package vmm runs virtual machines for the microvm and vm tiers: one QEMU
// process per VM, driven over QMP.
//
// # Process model
//
// Start spawns QEMU in a session of its own (Setsid) with an empty
// environment, always stopped (-S); it connects to QMP (which QEMU serves on
// RunDir/qmp.sock) and to the serial console, then lets the guest run. The
// VM handle reaps the process, and when it ends, for any reason, closes
// QMP and removes the sockets.
//
// There is deliberately no Pdeathsig. VMs must outlive a node service restart
// (Adopt re-attaches to them by pid and RunDir), and Pdeathsig would kill
// them with the agent. It would also be wrong in Go: it fires when the
// *thread* that forked exits, and the Go runtime ends threads at will (a
// goroutine that exits while locked to its thread), so VMs would die at
// random. Orphans are instead found by a sweep of processes whose command
// line names a RunDir the node no longer knows. Kill signals through a
// pidfd, and an adopted process is identified by (pid, start time), so a
// reused pid is never signalled.
//
// # Boot watchdog
//
// A TCG boot was seen to hang forever (docs/machine.md, "Virtualisation"), so
// every boot goes through VM.WaitReady, which kills the VM and fails with
// code "boot_timeout" if the guest is not ready in time. Every failure path
// of Start and WaitReady leaves no process, socket or log behind.
//
// # Least privilege
//
// QEMU runs with -sandbox (seccomp: no obsolete calls, no setuid, no
// fork/exec, no resource-control calls), -nodefaults -no-user-config (only
// the devices asked for), and no network unless a tap is given. The serial
// console goes through a socket into a log capped on disk (a guest may
// flood its console: attack A44, docs/adversarial.md). Config.User runs QEMU as an
// unprivileged uid and gid with only the supplementary groups given;
// Config.PassFiles hands it the kernel, initrd and disks as inherited
// descriptors (/proc/self/fd/<n>), so it needs no access to their
// directories; Config.Paused with VM.Cont lets the caller move QEMU into
// a cgroup before the guest's first instruction. The serial log is never
// opened through a symbolic link (RunDir may be QEMU's user's).
package vmm
