package guard

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -I/usr/include/x86_64-linux-gnu" -target amd64 -tags linux -type key4 -type key6 guard bpf/guard.c
