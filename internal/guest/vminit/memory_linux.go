package vminit

import (
	"fmt"
	"os"
)

// thrashTTL is how long, in milliseconds, the guest kernel keeps the
// pages its tasks touched before it would rather OOM-kill than evict them.
const thrashTTL = "1000"

// guardThrashing turns on the multi-generational LRU and its working-set
// protection (min_ttl_ms). The guest has no swap: when commands fill its
// memory, reclaim can only evict file pages, the binaries' own text
// among them, which the tasks fault straight back in. Without the
// protection the kernel can go on evicting and refaulting for minutes
// (under TCG we saw two: a hung sandbox, not an OOM kill) before the OOM
// killer acts; with it, the hog is killed within about a second of its
// working set no longer fitting. Kernels without MGLRU keep their
// default, which it reports.
func guardThrashing() error {
	const dir = "/sys/kernel/mm/lru_gen/"
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("no multi-generational LRU in this kernel: %w", err)
	}
	if err := os.WriteFile(dir+"enabled", []byte("y"), 0); err != nil {
		return fmt.Errorf("enabling the multi-generational LRU: %w", err)
	}
	if err := os.WriteFile(dir+"min_ttl_ms", []byte(thrashTTL), 0); err != nil {
		return fmt.Errorf("setting its min_ttl_ms: %w", err)
	}
	return nil
}
