package setup

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"github.com/dsec-dev/dsec/internal/sys"
)

// DropFilePages unmaps the pages of the agent's own executable that
// are mapped read-only (code and read-only data) so that an idle agent
// keeps resident only what it touches again. The kernel maps file pages
// in around every fault (fault-around) and setup runs code the idle agent
// never needs again, so nearly the whole binary ends up in the agent's
// RSS. The pages stay in the page cache (one copy on the node, shared by
// every sandbox): what comes back is a minor fault, not a read. Writable
// mappings are left alone; read-only ones are never written, so nothing
// is lost. Safe while other threads run: a dropped page is faulted in
// again.
func DropFilePages() error {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return err
	}
	defer f.Close()
	type span struct{ start, end uint64 }
	var exe string // the executable's inode (the agent has no libraries)
	byInode := map[string][]span{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode [path]
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[4] == "0" {
			continue
		}
		perms, inode := fields[1], fields[4]
		if exe == "" && perms == "r-xp" {
			exe = inode
		}
		if perms != "r-xp" && perms != "r--p" {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !ok || err1 != nil || err2 != nil {
			continue
		}
		byInode[inode] = append(byInode[inode], span{start, end})
	}
	if err := sc.Err(); err != nil {
		return err
	}
	for _, s := range byInode[exe] {
		// Raw addresses: the mappings are not Go memory.
		if err := sys.DropRange(uintptr(s.start), uintptr(s.end-s.start)); err != nil {
			return err
		}
	}
	return nil
}
