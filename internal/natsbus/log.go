package natsbus

import (
	"fmt"
	"log/slog"
)

// logAdapter routes the NATS server's log lines to slog. Notices and debug
// output are dropped: the server is an implementation detail of DSec.
type logAdapter struct{ l *slog.Logger }

func (a *logAdapter) Noticef(format string, v ...any) {}
func (a *logAdapter) Debugf(format string, v ...any)  {}
func (a *logAdapter) Tracef(format string, v ...any)  {}
func (a *logAdapter) Warnf(format string, v ...any) {
	a.l.Warn(fmt.Sprintf(format, v...), "component", "nats")
}
func (a *logAdapter) Errorf(format string, v ...any) {
	a.l.Error(fmt.Sprintf(format, v...), "component", "nats")
}
func (a *logAdapter) Fatalf(format string, v ...any) {
	a.l.Error(fmt.Sprintf(format, v...), "component", "nats", "fatal", true)
}
