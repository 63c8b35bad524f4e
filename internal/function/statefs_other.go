//go:build !linux

package function

// mountStateFS keeps sandbox state on the host file system where tmpfs
// mounts are not available.
func mountStateFS(dir string) (bool, error) { return false, nil }

func unmountStateFS(dir string) error { return nil }
