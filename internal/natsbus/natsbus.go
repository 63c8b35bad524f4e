// Package natsbus runs the embedded NATS JetStream server of `dsec up` and
// opens client connections, in-process or over the network. Every DSec
// component talks to the others through NATS, so one host and a cluster
// share one code path; only where the connection comes from differs.
package natsbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// MaxPayload is the largest message the embedded server accepts. File
// chunks stay well below it (and below a stock server's 1 MiB).
const MaxPayload = 8 << 20

// Options configure the embedded server.
type Options struct {
	// StoreDir holds JetStream's file storage.
	StoreDir string
	// Listen is host:port for NATS clients (other nodes, the nats CLI).
	// Empty means no listener: in-process connections only.
	Listen string
	// Token authenticates clients. Required when Listen is set.
	Token string
	// Logger receives the server's warnings and errors.
	Logger *slog.Logger
}

// Server is a running embedded NATS server.
type Server struct {
	ns    *server.Server
	token string
}

// Start starts the embedded server and waits until it accepts connections.
func Start(ctx context.Context, opt Options) (*Server, error) {
	if opt.StoreDir == "" {
		return nil, errors.New("natsbus: StoreDir is required")
	}
	if opt.Listen != "" && opt.Token == "" {
		return nil, errors.New("natsbus: a listening server needs a token")
	}
	so := &server.Options{
		ServerName:         "dsec",
		JetStream:          true,
		StoreDir:           opt.StoreDir,
		NoSigs:             true,
		MaxPayload:         MaxPayload,
		Authorization:      opt.Token,
		JetStreamMaxMemory: 256 << 20,
		// Sandbox events, heartbeats and exec traffic are many small
		// messages; the defaults for slow consumers suit that.
	}
	if opt.Listen == "" {
		so.DontListen = true
	} else {
		host, port, err := net.SplitHostPort(opt.Listen)
		if err != nil {
			return nil, fmt.Errorf("natsbus: listen address %q: %w", opt.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("natsbus: listen port %q: %w", port, err)
		}
		if p == 0 {
			p = server.RANDOM_PORT
		}
		so.Host, so.Port = host, p
	}
	ns, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("natsbus: configuring server: %w", err)
	}
	if opt.Logger != nil {
		ns.SetLoggerV2(&logAdapter{l: opt.Logger}, false, false, false)
	}
	go ns.Start()
	deadline := 30 * time.Second
	if d, ok := ctx.Deadline(); ok {
		deadline = time.Until(d)
	}
	if !ns.ReadyForConnections(deadline) {
		ns.Shutdown()
		return nil, errors.New("natsbus: embedded server did not become ready")
	}
	return &Server{ns: ns, token: opt.Token}, nil
}

// Connect opens an in-process connection to the embedded server.
func (s *Server) Connect(name string) (*nats.Conn, error) {
	return nats.Connect("", append(clientOptions(name, s.token), nats.InProcessServer(s.ns))...)
}

// ClientURL is the URL other processes use, or "" if the server does not
// listen.
func (s *Server) ClientURL() string {
	if s.ns.Addr() == nil {
		return ""
	}
	return s.ns.ClientURL()
}

// Shutdown stops the server after JetStream has flushed its state to disk.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// Dial connects to a NATS server by URL (cluster mode, `dsec node`).
func Dial(ctx context.Context, url, token, name string) (*nats.Conn, error) {
	opts := clientOptions(name, token)
	if d, ok := ctx.Deadline(); ok {
		opts = append(opts, nats.Timeout(time.Until(d)))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s: %w", url, err)
	}
	return nc, nil
}

func clientOptions(name, token string) []nats.Option {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
	}
	if token != "" {
		opts = append(opts, nats.Token(token))
	}
	return opts
}
