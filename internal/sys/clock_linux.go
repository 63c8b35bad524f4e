package sys

import (
	"time"

	"golang.org/x/sys/unix"
)

// Monotonic reads CLOCK_MONOTONIC, the clock the kernel stamps BPF events
// with (bpf_ktime_get_ns).
func Monotonic() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}
