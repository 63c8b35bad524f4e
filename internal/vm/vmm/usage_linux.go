package vmm

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Usage is what the host measures of a VM's QEMU process.
type Usage struct {
	// RSSBytes and PeakRSSBytes are its resident memory now and at most
	// (VmRSS and VmHWM of /proc/<pid>/status): the guest's touched
	// memory plus QEMU's own.
	RSSBytes, PeakRSSBytes int64
	// CPUSeconds is the CPU time it used, in user and kernel mode: every
	// vCPU's and QEMU's own.
	CPUSeconds float64
}

// userHZ is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on every
// Linux ABI DSec runs on).
const userHZ = 100

// Usage reads the process's usage from /proc. It fails with NotFound once
// the process is gone (a reused pid is not read: its start time differs).
func (vm *VM) Usage() (Usage, error) {
	gone := errdefs.New(errdefs.NotFound, api.CodeVMGone, "QEMU process %d has exited", vm.Pid)
	b, err := os.ReadFile("/proc/" + strconv.Itoa(vm.Pid) + "/stat")
	if err != nil {
		return Usage{}, gone
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Usage{}, fmt.Errorf("parsing /proc/%d/stat", vm.Pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): utime and stime (14, 15) are f[11] and
	// f[12], starttime (22) f[19].
	if len(f) < 20 {
		return Usage{}, fmt.Errorf("parsing /proc/%d/stat", vm.Pid)
	}
	if start, _ := strconv.ParseUint(f[19], 10, 64); start != vm.start || f[0] == "Z" || f[0] == "X" {
		return Usage{}, gone
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return Usage{}, fmt.Errorf("parsing /proc/%d/stat", vm.Pid)
	}
	u := Usage{CPUSeconds: float64(ut+st) / userHZ}
	sf, err := os.Open("/proc/" + strconv.Itoa(vm.Pid) + "/status")
	if err != nil {
		return Usage{}, gone
	}
	defer sf.Close()
	sc := bufio.NewScanner(sf)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return Usage{}, fmt.Errorf("parsing /proc/%d/status %s: %w", vm.Pid, k, err)
		}
		if k == "VmRSS" {
			u.RSSBytes = kb << 10
		} else {
			u.PeakRSSBytes = kb << 10
		}
	}
	return u, sc.Err()
}
