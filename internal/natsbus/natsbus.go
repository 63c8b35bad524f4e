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
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	// Name is the server's name, unique in a cluster ("dsec" alone).
	Name string
	// Cluster, if its Name is set, makes the server a member of a NATS
	// cluster with JetStream clustered across the members.
	Cluster Cluster
}

// Cluster is the embedded server's membership of a NATS cluster.
type Cluster struct {
	// Name is the cluster's name, the same on every member.
	Name string
	// Listen is host:port where the other members' routes connect.
	Listen string
	// Routes are the other members' route addresses (host:port or
	// nats-route://host:port). A member lists the others; the first
	// member may list none and be found by the rest.
	Routes []string
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
	name := opt.Name
	if name == "" {
		name = "dsec"
	}
	so := &server.Options{
		ServerName:         name,
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
		host, p, err := splitHostPort(opt.Listen)
		if err != nil {
			return nil, fmt.Errorf("natsbus: listen address: %w", err)
		}
		so.Host, so.Port = host, p
	}
	if opt.Cluster.Name != "" {
		if err := clusterOptions(so, opt.Cluster, opt.Token); err != nil {
			return nil, err
		}
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

// clusterOptions joins so to a cluster. Routes authenticate with the
// token, as clients do: a member that does not know it is refused.
func clusterOptions(so *server.Options, c Cluster, token string) error {
	if c.Listen == "" {
		return errors.New("natsbus: a cluster member needs a cluster listen address")
	}
	if token == "" {
		return errors.New("natsbus: a cluster member needs a token")
	}
	host, port, err := splitHostPort(c.Listen)
	if err != nil {
		return fmt.Errorf("natsbus: cluster listen address: %w", err)
	}
	so.Cluster = server.ClusterOpts{Name: c.Name, Host: host, Port: port, Username: routeUser, Password: token,
		ConnectRetries: -1, ConnectBackoff: true}
	for _, r := range c.Routes {
		u, err := routeURL(r, token)
		if err != nil {
			return err
		}
		so.Routes = append(so.Routes, u)
	}
	return nil
}

// routeUser is the user name routes authenticate as (the password is the
// token).
const routeUser = "dsec"

// routeURL turns host:port or nats-route://host:port into a route URL
// with the cluster's credentials.
func routeURL(r, token string) (*url.URL, error) {
	if !strings.Contains(r, "://") {
		r = "nats-route://" + r
	}
	u, err := url.Parse(r)
	if err != nil || u.Host == "" || u.Port() == "" {
		return nil, fmt.Errorf("natsbus: route %q: want host:port", r)
	}
	u.User = url.UserPassword(routeUser, token)
	return u, nil
}

func splitHostPort(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", 0, fmt.Errorf("%q: port %q is not a number", addr, port)
	}
	if p == 0 {
		p = server.RANDOM_PORT
	}
	return host, p, nil
}

// ClusterAddr is where the server accepts routes ("" outside a cluster).
func (s *Server) ClusterAddr() string {
	if a := s.ns.ClusterAddr(); a != nil {
		return a.String()
	}
	return ""
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

// WaitJetStream waits until JetStream answers on nc: a cluster's members
// start one by one, and its JetStream serves once they have elected a
// meta leader. It logs, now and then, what it waits for.
func WaitJetStream(ctx context.Context, nc *nats.Conn, log *slog.Logger) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("opening JetStream: %w", err)
	}
	var last time.Time
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for JetStream: %w (last: %v)", ctx.Err(), err)
		}
		if log != nil && time.Since(last) > 10*time.Second {
			log.Info("waiting for JetStream (a cluster serves once a majority of its members are up)", "err", err)
			last = time.Now()
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Replicas is the replica count to open stream with: want if set, else
// what the stream already has (so that a node, which does not know the
// cluster's size, never scales down what a server made), else 1.
func Replicas(ctx context.Context, js jetstream.JetStream, stream string, want int) int {
	if want > 0 {
		return want
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 1
	}
	if n := s.CachedInfo().Config.Replicas; n > 0 {
		return n
	}
	return 1
}

// KVStream is the stream behind key-value bucket b.
func KVStream(b string) string { return "KV_" + b }

// Unreachable reports whether err means that JetStream did not answer:
// no quorum in a cluster, no connection, a request that timed out.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	for _, e := range []error{context.DeadlineExceeded, nats.ErrTimeout, nats.ErrNoResponders,
		nats.ErrConnectionClosed, nats.ErrDisconnected, nats.ErrConnectionReconnecting,
		jetstream.ErrNoStreamResponse, jetstream.ErrJetStreamNotEnabled, jetstream.ErrServerShutdown} {
		if errors.Is(err, e) {
			return true
		}
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jsClusterNotAvailable, jsInsufficientResources:
			return true
		}
	}
	return false
}

// JetStream API error codes of a cluster that cannot serve.
const (
	jsClusterNotAvailable   = 10008 // JetStream system temporarily unavailable
	jsInsufficientResources = 10023 // too few members up to place a stream
)

// Retry calls open until it succeeds, fails otherwise than Unreachable,
// or ctx ends: a cluster's members starting together each make the same
// replicated buckets, and the first attempts may time out while the
// cluster places them.
func Retry(ctx context.Context, log *slog.Logger, what string, open func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		// Longer than JetStream's default of 5 s: a replicated stream's
		// create answers once its group has elected a leader.
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := open(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !Unreachable(err) {
			return err
		}
		if log != nil {
			log.Info("JetStream not ready; retrying", "what", what, "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}

// EnsureStream opens stream cfg.Name, creating it, or updating it where
// it differs from cfg in what DSec sets. A stream that is as wanted is
// only looked up: in a cluster, servers starting together that all ask
// to create or update the same stream leave all but one without an
// answer (they time out, and their retry finds it).
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	if s, err := js.Stream(ctx, cfg.Name); err == nil && sameStream(s.CachedInfo().Config, cfg) {
		return s, nil
	}
	return js.CreateOrUpdateStream(ctx, cfg)
}

// EnsureKV is EnsureStream for a key-value bucket.
func EnsureKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if s, err := js.Stream(ctx, KVStream(cfg.Bucket)); err == nil {
		have := s.CachedInfo().Config
		if have.Replicas == max(cfg.Replicas, 1) && have.MaxAge == cfg.TTL && have.Description == cfg.Description &&
			have.MaxMsgsPerSubject == int64(max(cfg.History, 1)) {
			return js.KeyValue(ctx, cfg.Bucket)
		}
	}
	return js.CreateOrUpdateKeyValue(ctx, cfg)
}

// sameStream compares the settings DSec gives its streams.
func sameStream(have, want jetstream.StreamConfig) bool {
	norm := func(n int64) int64 {
		if n == 0 {
			return -1 // unlimited, as the server reports it
		}
		return n
	}
	return have.Replicas == max(want.Replicas, 1) && have.MaxAge == want.MaxAge && have.Description == want.Description &&
		slices.Equal(have.Subjects, want.Subjects) && norm(have.MaxMsgs) == norm(want.MaxMsgs) &&
		norm(have.MaxBytes) == norm(want.MaxBytes) && norm(have.MaxMsgsPerSubject) == norm(want.MaxMsgsPerSubject) &&
		have.Discard == want.Discard && have.AllowDirect == want.AllowDirect && have.Storage == want.Storage
}
