package sys

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// ThreadCPUs returns the CPUs the calling thread may run on.
func ThreadCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("reading the CPU affinity: %w", err)
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// SetThreadCPUs limits the calling thread to cpus (a thread or process it
// starts inherits that).
func SetThreadCPUs(cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("setting the CPU affinity: %w", err)
	}
	return nil
}

// UnpinThreads lets every thread of this process run on any CPU (the
// kernel keeps each within its cpuset). A thread started meanwhile by
// one not yet changed inherits the old affinity, so it goes over the
// threads until a pass finds none it had not seen.
func UnpinThreads() error {
	var all unix.CPUSet
	for c := 0; c < len(all)*64; c++ {
		all.Set(c)
	}
	done := map[int]bool{}
	for pass := 0; pass < 8; pass++ {
		d, err := os.Open("/proc/self/task")
		if err != nil {
			return err
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return err
		}
		fresh := false
		for _, n := range names {
			tid, err := strconv.Atoi(n)
			if err != nil || done[tid] {
				continue
			}
			fresh = true
			// ESRCH: the thread has exited since the listing.
			if err := unix.SchedSetaffinity(tid, &all); err != nil && err != unix.ESRCH {
				return fmt.Errorf("setting thread %d's CPU affinity: %w", tid, err)
			}
			done[tid] = true
		}
		if !fresh {
			return nil
		}
	}
	return nil
}
