//go:build !linux

package sys

func MountsUnder(string) ([]string, error) { return nil, nil }

func MountInfoUnder(string) ([]MountEntry, error) { return nil, nil }
