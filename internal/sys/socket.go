package sys

// Ucred is a Unix socket peer's credentials (SO_PEERCRED), as seen from
// this process's namespaces: Pid is 0 when the peer's process has no pid
// in this process's pid namespace (it lives in an ancestor namespace), and
// Uid/Gid are the overflow ids (65534) when they do not map into this
// process's user namespace.
type Ucred struct {
	Pid int32
	Uid uint32
	Gid uint32
}
