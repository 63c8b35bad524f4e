package main

import (
	"os"
	"syscall"
)

func openRaw(dirFd int, path string) (*os.File, error) {
	fd, err := syscall.Openat(dirFd, path, syscall.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}
