package monitor

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -D__TARGET_ARCH_x86 -I/usr/include/x86_64-linux-gnu" -target amd64 -tags linux -type event -type exec_key -type exec_policy -type syscall_spec monitor bpf/monitor.c
