package container

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/audit"
	"github.com/dsec-dev/dsec/internal/monitor"
)

// auditLog collects the audit events of the isolation tests' monitor.
type auditLog struct {
	mu  sync.Mutex
	evs []api.AuditEvent
}

func (l *auditLog) Append(_ context.Context, e api.AuditEvent) error {
	l.mu.Lock()
	l.evs = append(l.evs, e)
	l.mu.Unlock()
	return nil
}

// startAudit starts the eBPF monitor for a test: its recorder (for
// runtimeOptions.monitor) and the log it records to. It is stopped after
// the cleanups registered later (the runtimes'). As on a node, the rule of
// connects to the node (node-connect) comes first: node are its
// prefixes (the sandbox network and the node's addresses).
func startAudit(t *testing.T, node ...netip.Prefix) (*audit.Recorder, *auditLog) {
	t.Helper()
	_, rec, log := startMonitor(t, node...)
	return rec, log
}

// startMonitor is startAudit that also returns the monitor, for a test
// that restricts executables through it (Options.Exec).
func startMonitor(t *testing.T, node ...netip.Prefix) (*monitor.Monitor, *audit.Recorder, *auditLog) {
	t.Helper()
	mon, err := monitor.Start(nil)
	if err != nil {
		t.Fatalf("the eBPF monitor: %v", err)
	}
	rules, err := audit.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	if len(node) > 0 {
		rules = append([]audit.Rule{audit.NodeRule(node)}, rules...)
	}
	log := &auditLog{}
	rec := audit.NewRecorder(mon, rules, log, nil)
	// bounded: closing the monitor ends the recorder's loop
	t.Cleanup(func() { mon.Close(); rec.Wait() })
	return mon, rec, log
}

// audited fails the test unless sb's audit events include one of rule
// with the verdict ("": any), for each syscall listed, within 5 s: an
// attack that is blocked must also be seen.
func (e *isoEnv) audited(t *testing.T, sb *Sandbox, rule, verdict string, syscalls ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		missing := []string{}
		e.audit.mu.Lock()
		for _, sc := range syscalls {
			found := false
			for _, ev := range e.audit.evs {
				found = found || ev.Sandbox == sb.id && ev.Rule == rule && (verdict == "" || ev.Verdict == verdict) && ev.Syscall == sc
			}
			if !found {
				missing = append(missing, sc)
			}
		}
		var seen []string
		if len(missing) > 0 && time.Now().After(deadline) {
			for _, ev := range e.audit.evs {
				if ev.Sandbox == sb.id && ev.Kind == "syscall" {
					seen = append(seen, fmt.Sprintf("%s %s %d %s %s", ev.Syscall, ev.Path, ev.Result, ev.Verdict, ev.Rule))
				}
			}
		}
		e.audit.mu.Unlock()
		if len(missing) == 0 {
			return
		}
		if seen != nil || time.Now().After(deadline) {
			t.Errorf("no audit event of rule %s (%s) for %v in %s; its syscall events:\n  %s", rule, verdict, missing, sb.id, strings.Join(seen, "\n  "))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// auditedWhere fails the test unless sb's audit events include one of
// rule ("": any) with the verdict ("": any) that ok accepts (nil: any),
// within 5 s.
func (e *isoEnv) auditedWhere(t *testing.T, sb *Sandbox, rule, verdict, what string, ok func(api.AuditEvent) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		found := false
		var seen []string
		e.audit.mu.Lock()
		for _, ev := range e.audit.evs {
			found = found || ev.Sandbox == sb.id && (rule == "" || ev.Rule == rule) && (verdict == "" || ev.Verdict == verdict) && (ok == nil || ok(ev))
		}
		if !found && time.Now().After(deadline) {
			for _, ev := range e.audit.evs {
				if ev.Sandbox == sb.id && (ev.Rule != "" || ev.Kind == "exec") {
					seen = append(seen, fmt.Sprintf("%s %s %s %q %s %d %s %s", ev.Phase, ev.Kind, ev.Syscall, ev.Path, ev.Addr, ev.Result, ev.Verdict, ev.Rule))
				}
			}
		}
		e.audit.mu.Unlock()
		if found {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("no audit event of rule %s (%s) for %s in %s; its events with a rule, and execs:\n  %s", rule, verdict, what, sb.id, strings.Join(seen, "\n  "))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hasEvent reports whether sb has an audit event ok accepts.
func (e *isoEnv) hasEvent(sb *Sandbox, ok func(api.AuditEvent) bool) bool {
	e.audit.mu.Lock()
	defer e.audit.mu.Unlock()
	for _, ev := range e.audit.evs {
		if ev.Sandbox == sb.id && ok(ev) {
			return true
		}
	}
	return false
}

// waitEvent waits up to d for an audit event of sb that ok accepts.
func waitEvent(e *isoEnv, sb *Sandbox, d time.Duration, ok func(api.AuditEvent) bool) bool {
	deadline := time.Now().Add(d)
	for !e.hasEvent(sb, ok) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// auditedPath is auditedWhere for a call on a path.
func (e *isoEnv) auditedPath(t *testing.T, sb *Sandbox, rule, verdict, syscall, path string) {
	t.Helper()
	e.auditedWhere(t, sb, rule, verdict, syscall+" "+path, func(ev api.AuditEvent) bool { return ev.Syscall == syscall && ev.Path == path })
}

// ruleless fails the test if sb's audit events of what ok accepts have a
// rule, or if there are none within 5 s: the control of the rules, a
// benign action of the same kind as an attack.
func (e *isoEnv) ruleless(t *testing.T, sb *Sandbox, what string, ok func(api.AuditEvent) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := 0
		e.audit.mu.Lock()
		for _, ev := range e.audit.evs {
			if ev.Sandbox == sb.id && ok(ev) {
				n++
				if ev.Rule != "" {
					t.Errorf("the benign %s hit rule %s: %+v", what, ev.Rule, ev)
				}
			}
		}
		e.audit.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("no audit event of the benign %s in %s: the control saw nothing", what, sb.id)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unaudited fails the test if sandbox sb (a control, not watched) has any
// audit event.
func (e *isoEnv) unaudited(t *testing.T, id string) {
	t.Helper()
	e.audit.mu.Lock()
	defer e.audit.mu.Unlock()
	for _, ev := range e.audit.evs {
		if ev.Sandbox == id {
			t.Errorf("an audit event of the unwatched sandbox %s: %+v", id, ev)
			return
		}
	}
}

// sawConnects fails the test unless sb's audit events include a failed
// connect to each of targets (address:port) within 5 s.
func (e *isoEnv) sawConnects(t *testing.T, sb *Sandbox, targets []string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		missing := []string{}
		e.audit.mu.Lock()
		for _, target := range targets {
			found := false
			for _, ev := range e.audit.evs {
				found = found || ev.Sandbox == sb.id && ev.Syscall == "connect" && ev.Addr == target && ev.Verdict != "allowed"
			}
			if !found {
				missing = append(missing, target)
			}
		}
		e.audit.mu.Unlock()
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("no audit event of the refused connects to %v from %s", missing, sb.id)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// notHit fails the test if sandbox sb (a control) has an event of rule.
func (e *isoEnv) notHit(t *testing.T, sb *Sandbox, rule string) {
	t.Helper()
	e.audit.mu.Lock()
	defer e.audit.mu.Unlock()
	for _, ev := range e.audit.evs {
		if ev.Sandbox == sb.id && ev.Rule == rule {
			t.Errorf("the control %s hit rule %s: %+v", sb.id, rule, ev)
			return
		}
	}
}
