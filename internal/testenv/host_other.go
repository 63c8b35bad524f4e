//go:build !linux

package testenv

import "testing"

// Sandboxes names what a test's container sandboxes put on the host;
// off Linux there are none, and nothing to find.
type Sandboxes struct {
	Net, CgroupParent string
	GuardPins         string
}

func HostLeftovers(Sandboxes) []string      { return nil }
func NoHostLeftovers(testing.TB, Sandboxes) {}
func Live(leftovers []string) []string      { return leftovers }
