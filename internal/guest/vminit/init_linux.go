package vminit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/dsec-dev/dsec/internal/guest/agent"
	"github.com/dsec-dev/dsec/internal/sys"
	"github.com/dsec-dev/dsec/internal/vm/vmconfig"
)

// systemInit is the image's init system the guest hands PID 1 to, or ""
// if it has none: /sbin/init when it is systemd (resolved inside the
// guest's root, which the init has switched into).
func systemInit() string {
	p, err := filepath.EvalSymlinks("/sbin/init")
	if err != nil || filepath.Base(p) != "systemd" {
		return ""
	}
	if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return ""
	}
	return p
}

// handOver starts the agent as a process of its own (dsec-guest
// AgentArg, a child subreaper serving agentPort; upper, if not nil, is
// the writable layer's directory, its descriptor 3) and then executes
// init as PID 1. It returns only if either fails.
func (g *guest) handOver(cfg *vmconfig.Config, agentPort, init string, upper *os.File) error {
	env, err := json.Marshal(cfg.Env)
	if err != nil {
		return err
	}
	console, _ := g.console.(*os.File)
	if console == nil {
		console = os.Stdout
	}
	attr := &os.ProcAttr{
		Env:   []string{},
		Files: []*os.File{nil, console, console},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	}
	args := []string{"dsec-guest", AgentArg, agentPort, g.version, string(env)}
	if upper != nil {
		attr.Files = append(attr.Files, upper)
		args = append(args, upperFDArg)
	}
	// The init's own binary, from the initramfs (hidden under the new
	// root, reached through /proc).
	p, err := os.StartProcess("/proc/self/exe", args, attr)
	if err != nil {
		return fmt.Errorf("starting the agent beside %s: %w", init, err)
	}
	p.Release()
	if upper != nil {
		upper.Close() // the agent's now; systemd must not inherit it
	}
	g.say(fmt.Sprintf("%s init=%s", g.readyLine(), init))
	// systemd finds a console and its own mounts (proc, sys, dev are
	// there already); its environment is the kernel's.
	err = sys.Exec(init, []string{"/sbin/init"}, []string{"container=", "TERM=linux"})
	return fmt.Errorf("executing %s: %w", init, err)
}

// upperFDArg is the agent process's last argument when the init hands
// it the writable layer's directory as descriptor 3.
const upperFDArg = "upper-fd=3"

// AgentMain is the agent process of a guest whose image's init system is
// PID 1 (args: the port, the version, the JSON of the commands' base
// environment, and upperFDArg when descriptor 3 is the writable layer's
// directory): a child subreaper, so the orphans of its commands are its
// to reap. It returns when the agent stops.
func AgentMain(args []string) error {
	var upper *os.File
	if len(args) == 4 && args[3] == upperFDArg {
		upper, args = os.NewFile(3, "upper"), args[:3]
	}
	if len(args) != 3 {
		return errors.New("usage: dsec-guest vm-agent <port> <version> <env json> [" + upperFDArg + "]")
	}
	var env []string
	if err := json.Unmarshal([]byte(args[2]), &env); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err := agent.Run(context.Background(), agent.Options{
		Listener:   newPortListener(args[0]),
		Logger:     logger,
		Version:    args[1],
		DefaultEnv: append([]string{agent.DefaultPath}, env...),
		Subreaper:  true,
		Upper:      upper,
	})
	if err == nil {
		err = errors.New("the agent stopped")
	}
	return err
}
