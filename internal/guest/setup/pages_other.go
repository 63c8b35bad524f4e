//go:build !linux

package setup

// DropFilePages does nothing off Linux.
func DropFilePages() error { return nil }
