package vmkernel

import (
	"bufio"
	"math"
	"os"
	"strconv"
	"strings"
)

// HostTSCkHz returns the host's TSC frequency in kHz as /proc/cpuinfo's
// first "cpu MHz" gives it on a host with a constant TSC, or 0 if unknown.
//
// A TCG guest reads the host's TSC, and its kernel calibrates the TSC
// against the emulated PIT; under host load that calibration fails
// ("tsc: Unable to calibrate against PIT … Marking TSC unstable") and the
// microvm guest, which has no HPET or ACPI PM timer to fall back on, hangs
// early in boot (2 boots in 6 here). Booting TCG guests with
// tsc_early_khz=HostTSCkHz() skips the calibration: 0 hangs in 8.
func HostTSCkHz() int {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	return parseCPUInfoTSC(f)
}

func parseCPUInfoTSC(f *os.File) int {
	s := bufio.NewScanner(f)
	mhz, constant := 0.0, false
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok {
			if mhz != 0 {
				break // end of the first CPU
			}
			continue
		}
		switch strings.TrimSpace(k) {
		case "cpu MHz":
			mhz, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		case "flags":
			constant = strings.Contains(" "+v+" ", " constant_tsc ")
		}
	}
	if !constant || mhz <= 0 {
		return 0
	}
	return int(math.Round(mhz * 1000))
}

// Cmdline is the guest kernel's command line for a boot under TCG (tcg)
// or KVM, with extra appended:
//
//   - console=ttyS0 quiet panic=-1: the serial console, only the kernel's
//     warnings on it, and a panic powers the VM off (QEMU runs with
//     -no-reboot);
//   - cryptomgr.notests: no self-tests of the kernel's crypto algorithms
//     as they register (~0.4 s of a TCG boot, measured; the tests check
//     implementations, they protect nothing, and a kernel in FIPS mode
//     ignores the option);
//   - under TCG, tsc_early_khz=HostTSCkHz() when known (see HostTSCkHz).
func Cmdline(tcg bool, extra ...string) string {
	c := "console=ttyS0 quiet panic=-1 cryptomgr.notests"
	if khz := HostTSCkHz(); tcg && khz > 0 {
		c += " tsc_early_khz=" + strconv.Itoa(khz)
	}
	for _, e := range extra {
		c += " " + e
	}
	return c
}
