package container

import (
	"bytes"
	"time"
)

// zombie reports whether a /proc/<pid>/stat line is of a zombie.
func zombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

func sleepBrief() { time.Sleep(5 * time.Millisecond) }
