//go:build !linux

package vmm

import (
	"net"
	"syscall"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

func procStat(int) (byte, uint64, error)  { return 0, 0, errdefs.ErrNotSupported }
func procAlive(int, uint64) bool          { return false }
func procCmdline(int) ([]string, error)   { return nil, errdefs.ErrNotSupported }
func peerPid(net.Conn) (int, error)       { return 0, errdefs.ErrNotSupported }
func sysProcAttr() *syscall.SysProcAttr   { return &syscall.SysProcAttr{Setsid: true} }
func probeProcAttr() *syscall.SysProcAttr { return sysProcAttr() }
