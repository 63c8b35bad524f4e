package vmtier

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/dsec-dev/dsec/internal/monitor"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/vm/vmm"
)

// A VM's liveness. A guest may panic (its kernel runs the task's code
// as root: `echo c > /proc/sysrq-trigger`), power off or reboot, and
// QEMU runs with -no-reboot and the guest kernel with panic=-1, so each
// of these ends QEMU; QEMU may also crash or be killed. Each sandbox
// has a goroutine that waits for its QEMU's end (vmm.VM.Done: a wait on
// our child, or a poll of an adopted one that QMP's end hurries) and
// reads its QMP events meanwhile: an end that Destroy did not ask for is
// the sandbox's failure. The runtime tells why (the last SHUTDOWN
// event's reason, the console's panic line, QEMU's exit status),
// records a sandbox-ended audit event, releases the sandbox as Destroy
// does and tells the node (sandbox.EndNotifier).
//
// A guest whose kernel lives on while its agent is gone (the vm tier's
// agent beside systemd, if it dies) is not noticed here: its calls fail
// with agent_gone until the sandbox is deleted or expires.

var _ sandbox.EndNotifier = (*Runtime)(nil)

// recorder is the node's audit recorder (audit.Recorder).
type recorder interface {
	Record(id, phase string, e monitor.Event)
}

// OnEnd implements sandbox.EndNotifier.
func (r *Runtime) OnEnd(fn func(sandbox.Ended)) { r.ends.OnEnd(fn) }

// watchVM starts s's watch (once s is registered).
func (s *Sandbox) watchVM() {
	var events <-chan vmm.Event
	if q := s.vm.QMP(); q != nil {
		events = q.Events()
	}
	go func() {
		var last *shutdown
		for {
			select {
			case <-s.gone:
				return
			case ev, ok := <-events:
				if !ok {
					events = nil
					continue
				}
				if sd := parseShutdown(ev); sd != nil {
					last = sd
				}
			case <-s.vm.Done():
				// Events QEMU sent just before it exited.
				for drained := false; !drained && events != nil; {
					select {
					case ev, ok := <-events:
						if sd := parseShutdown(ev); ok && sd != nil {
							last = sd
						}
						drained = !ok
					default:
						drained = true
					}
				}
				s.ended(last)
				return
			}
		}
	}()
}

// shutdown is what QEMU's last SHUTDOWN (or GUEST_PANICKED) event said.
type shutdown struct {
	Guest  bool   `json:"guest"`
	Reason string `json:"reason"`
	panic  bool
}

func parseShutdown(ev vmm.Event) *shutdown {
	switch ev.Name {
	case "GUEST_PANICKED":
		return &shutdown{Guest: true, Reason: "guest-panic", panic: true}
	case "SHUTDOWN":
		var sd shutdown
		if json.Unmarshal(ev.Data, &sd) != nil {
			return nil
		}
		return &sd
	}
	return nil
}

// ended handles the end of s's QEMU, unless Destroy asked for it.
func (s *Sandbox) ended(sd *shutdown) {
	s.mu.Lock()
	asked := s.destroyed
	s.mu.Unlock()
	if asked {
		return
	}
	end := s.vmEnd(sd)
	s.rt.log.Warn("a VM ended by itself", "sandbox", s.id, "reason", end.Reason())
	if rec := s.rt.opt.Audit; rec != nil {
		e := monitor.Event{Time: time.Now(), Kind: monitor.KindSandboxEnded, Pid: uint32(end.Pid), Comm: "qemu",
			Path: s.rt.qemuBinary(), Ret: int64(end.Status), Detail: end.Reason()}
		if u := s.vm.User(); u != nil {
			e.UID = u.UID
		}
		rec.Record(s.id, s.Phase(), e)
	}
	if err := s.rt.ends.Ended(end, s.Destroy); err != nil {
		s.rt.log.Error("releasing a sandbox whose VM ended", "sandbox", s.id, "err", err)
	}
}

// vmEnd says how s's VM ended, from QEMU's last SHUTDOWN event sd (nil:
// none), the console's end and QEMU's exit status.
func (s *Sandbox) vmEnd(sd *shutdown) sandbox.Ended {
	end := sandbox.Ended{ID: s.id, Pid: s.vm.Pid, Status: -1}
	exit := "QEMU exited (adopted, not the node's child: no exit status)"
	if ps := s.vm.ProcessState(); ps != nil {
		ws, _ := ps.Sys().(syscall.WaitStatus)
		end.Status = int(ws)
		if ws.Signaled() {
			exit = "QEMU was killed by " + sys.SignalName(ws.Signal())
		} else {
			exit = fmt.Sprintf("QEMU exited with status %d", ws.ExitStatus())
		}
	}
	panicLine := consolePanic(s.vm.SerialLog())
	switch {
	case panicLine != "" || sd != nil && sd.panic:
		end.Code, end.Detail = sandbox.EndGuestPanicked, "the guest kernel panicked"
		if panicLine != "" {
			end.Detail += ": " + panicLine
		}
	case sd != nil && sd.Guest && sd.Reason == "guest-shutdown":
		end.Code, end.Detail = sandbox.EndGuestPoweredOff, "the guest powered off"
	case sd != nil && sd.Guest && sd.Reason == "guest-reset":
		end.Code, end.Detail = sandbox.EndGuestRebooted, "the guest rebooted, which ends a VM (-no-reboot)"
	case sd != nil:
		end.Code, end.Detail = sandbox.EndVMMExited, fmt.Sprintf("%s after a shutdown (%s)", exit, sd.Reason)
	default:
		end.Code, end.Detail = sandbox.EndVMMExited, exit
	}
	return end
}

// consoleTail is how much of the console log's end is searched for a
// panic: the kernel prints its panic line, then a backtrace of ~2 KiB.
const consoleTail = 16 << 10

// consolePanic returns the guest kernel's panic line ("Kernel panic -
// not syncing: …") from the end of the console log at path, or "".
func consolePanic(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > consoleTail {
		_, _ = f.Seek(-consoleTail, io.SeekEnd)
	}
	b, _ := io.ReadAll(io.LimitReader(f, consoleTail))
	text := string(b)
	i := strings.LastIndex(text, "Kernel panic - not syncing")
	if i < 0 {
		return ""
	}
	line, _, _ := strings.Cut(text[i:], "\n")
	return strings.TrimSpace(line)
}

// qemuBinary is the path of QEMU's binary, as the node started it.
func (r *Runtime) qemuBinary() string {
	bin := r.opt.QEMU
	if bin == "" {
		bin = "qemu-system-x86_64"
	}
	if !filepath.IsAbs(bin) {
		if p, err := exec.LookPath(bin); err == nil {
			bin = p
		}
	}
	return bin
}
