package daemon

import (
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/dsec-dev/dsec/internal/cleanup"
)

// startDebug serves pprof on the debug address, if one is configured.
func (d *daemon) startDebug(cu *cleanup.Stack) error {
	if d.cfg.API.DebugListen == "" {
		return nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	ln, err := net.Listen("tcp", d.cfg.API.DebugListen)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Warn("debug server", "err", err)
		}
	}()
	cu.Add(func() { hs.Close() })
	d.log.Info("pprof served", "addr", ln.Addr().String())
	return nil
}
