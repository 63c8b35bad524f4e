package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
)

// record is what survives a restart of the node service about one live
// sandbox, in <StateDir>/<Name>/<id>.json: with it New re-adopts the
// sandbox without resolving its names again.
type record struct {
	Version int                     `json:"version"`
	ID      string                  `json:"id"`
	Addr    netip.Addr              `json:"addr"`
	HostIf  string                  `json:"host_if"`
	Policy  Policy                  `json:"policy"`
	Hosts   map[string][]netip.Addr `json:"hosts,omitempty"`
}

const recordVersion = 1

// writeRecord replaces path atomically (write, rename).
func writeRecord(path string, r record) error {
	r.Version = recordVersion
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing network state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing network state: %w", err)
	}
	return nil
}

func readRecord(path string) (record, error) {
	var r record
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	if r.Version != recordVersion {
		return r, fmt.Errorf("%s: version %d, want %d", filepath.Base(path), r.Version, recordVersion)
	}
	return r, nil
}

// recorded answers lookups from the addresses a record kept, so that a
// re-adopted policy compiles to the same elements.
type recorded map[string][]netip.Addr

func (r recorded) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, errors.New("not recorded")
}
