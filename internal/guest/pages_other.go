//go:build !linux

package guest

// DropFilePages does nothing off Linux.
func DropFilePages() error { return nil }
