package container

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/network"
	"github.com/dsec-dev/dsec/internal/sandbox"
	"github.com/dsec-dev/dsec/internal/testenv"
)

// recordingListener remembers the remote address of every connection it
// accepts.
type recordingListener struct {
	net.Listener
	mu    sync.Mutex // guards following fields
	addrs []netip.Addr
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.addrs = append(l.addrs, c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap())
		l.mu.Unlock()
	}
	return c, err
}

// from counts the connections accepted from addr.
func (l *recordingListener) from(addr netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, a := range l.addrs {
		if a == addr {
			n++
		}
	}
	return n
}

// serveHTTP serves ln with a handler that answers every request with body
// and records who posted.
func serveHTTP(t *testing.T, ln net.Listener, body string) *recordingListener {
	rl := &recordingListener{Listener: ln}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(rl)
	t.Cleanup(func() { srv.Close() })
	return rl
}

// nodeAddr is the node's own address on the interface of its default
// route (the node and its control plane stand behind it).
func nodeAddr(t *testing.T) netip.Addr {
	t.Helper()
	b, err := os.ReadFile("/proc/net/route")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 2 || f[1] != "00000000" {
			continue
		}
		ifc, err := net.InterfaceByName(f[0])
		if err != nil {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
				return p.Addr()
			}
		}
	}
	t.Skip("the node has no default route with an IPv4 address")
	return netip.Addr{}
}

// hostGet fetches url from the host and returns the body.
func hostGet(t *testing.T, method, url string) string {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(`{"passed":true}`))
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("negative control: the node cannot reach %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// testNetwork covers §3.3: metadata, the node and control plane,
// neighbours, raw sockets.
func testNetwork(t *testing.T, e *isoEnv, isolated *Sandbox) {
	ctx := context.Background()
	// The default policy (no egress) gives a sandbox a namespace of its
	// own with only lo: the probes below run from it too. The sandbox the
	// node links is the one with a narrow allow-list (nothing here is on
	// it).
	main := e.create(t, "iso-net", func(s *sandbox.Spec) {
		s.Network = &api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: "203.0.113.7/32", Proto: "tcp", Ports: "9"}}}
	})
	if _, ok := e.rt.nets.Endpoint(isolated.ID()); ok {
		t.Errorf("a sandbox without egress has a node-made network")
	}
	mainEP, ok := e.rt.nets.Endpoint(main.ID())
	if !ok {
		t.Fatal("no endpoint for the main sandbox")
	}
	// Every probe's connections end in a refusal or a timeout: the
	// listeners' records are what says the packets went nowhere.
	notConnected := []string{"ECONNREFUSED", "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH", "EACCES", "EPERM"}

	t.Run("A31_metadata", func(t *testing.T) {
		// The metadata service, served by the node itself on an address
		// of its own (a veth pair made for the purpose).
		const meta = "169.254.169.254"
		testenv.HostVeth(t, fmt.Sprintf("dsmd%04x", os.Getpid()&0xffff), nil, net.ParseIP(meta), 32)
		ln, err := net.Listen("tcp4", meta+":0")
		if err != nil {
			t.Fatal(err)
		}
		rl := serveHTTP(t, ln, "AKIA-dsec-isolation-credentials")
		target := ln.Addr().String()
		url := "http://" + target + "/latest/meta-data/iam/security-credentials/"
		for _, sb := range []*Sandbox{main, isolated} {
			expect(t, sb.ID(), probeIn(t, sb, "connect", target), map[string][]string{target: notConnected})
			e.audited(t, sb, "metadata-connect", "", "connect")
		}
		res := run(t, main, "wget", "-q", "-O-", "-T", "2", url)
		if res.ExitCode == 0 || strings.Contains(res.Stdout, "AKIA") {
			t.Errorf("wget of the metadata service from the sandbox: %+v", res)
		}
		for _, name := range []string{"metadata.google.internal", "instance-data"} {
			if res := run(t, main, "wget", "-q", "-O-", "-T", "2", "http://"+name+"/"); res.ExitCode == 0 {
				t.Errorf("wget %s from the sandbox: %+v", name, res)
			}
		}
		// IPv6 (fd00:ec2::254): the sandbox has none.
		expect(t, "sandbox", probeIn(t, main, "connect", "[fd00:ec2::254]:80"), map[string][]string{"[fd00:ec2::254]:80": append(notConnected, "EADDRNOTAVAIL", "EAFNOSUPPORT")})
		if n := rl.from(mainEP.Addr); n != 0 {
			t.Errorf("the metadata service accepted %d connections from the sandbox", n)
		}
		// Negative control: the node reaches it.
		if body := hostGet(t, http.MethodGet, url); !strings.Contains(body, "AKIA") {
			t.Errorf("negative control: the node got %q", body)
		}
	})

	// The node and its control plane: a server on every address of the
	// node.
	ln, err := net.Listen("tcp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	node := serveHTTP(t, ln, "accepted")
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	addr := nodeAddr(t)

	t.Run("A32_node_and_control_plane", func(t *testing.T) {
		targets := []string{mainEP.Gateway.String() + ":" + port, addr.String() + ":" + port, "127.0.0.1:" + port}
		for _, sb := range []*Sandbox{main, isolated} {
			expect(t, sb.ID(), probeIn(t, sb, append([]string{"connect"}, targets...)...), all(targets, notConnected...))
			// Seen, each with its failure; the node's own addresses with
			// the node's rule (a sandbox's 127.0.0.1 is its own).
			e.sawConnects(t, sb, targets)
			for _, a := range targets[:2] {
				e.auditedWhere(t, sb, "node-connect", "", "connect "+a, func(ev api.AuditEvent) bool { return ev.Syscall == "connect" && ev.Addr == a })
			}
		}
		if n := node.from(mainEP.Addr); n != 0 {
			t.Errorf("the node accepted %d connections from the sandbox", n)
		}
		// No runtime or orchestrator socket, no token.
		res := run(t, main, sh(`ls -d /var/run/docker.sock /run/docker.sock /run/containerd /var/run/secrets /run/secrets /run/dsec* 2>/dev/null; env | grep -i -e token -e secret -e nats`)...)
		if strings.TrimSpace(res.Stdout) != "" {
			t.Errorf("the sandbox has: %q", res.Stdout)
		}
		if res := run(t, main, "wget", "-q", "-O-", "-T", "2", "https://kubernetes.default.svc/"); res.ExitCode == 0 {
			t.Errorf("kubernetes.default.svc from the sandbox: %+v", res)
		}
		// Negative control: the node reaches its own server on both.
		for _, a := range []string{"127.0.0.1", addr.String()} {
			if body := hostGet(t, http.MethodGet, "http://"+a+":"+port+"/"); body != "accepted" {
				t.Errorf("negative control: %s: %q", a, body)
			}
		}
	})

	t.Run("A33_fake_a_pass", func(t *testing.T) {
		for _, a := range []string{addr.String(), mainEP.Gateway.String()} {
			url := "http://" + a + ":" + port + "/v1/tasks/t1/result"
			res := run(t, main, "wget", "-q", "-O-", "-T", "2", "--post-data", `{"passed":true}`, url)
			if res.ExitCode == 0 || strings.Contains(res.Stdout, "accepted") {
				t.Errorf("the sandbox posted a verdict to %s: %+v", url, res)
			}
		}
		if n := node.from(mainEP.Addr); n != 0 {
			t.Errorf("the orchestrator accepted %d connections from the sandbox", n)
		}
		// Negative control: the same post from the node is accepted.
		if body := hostGet(t, http.MethodPost, "http://"+addr.String()+":"+port+"/v1/tasks/t1/result"); body != "accepted" {
			t.Errorf("negative control: %q", body)
		}
	})

	t.Run("A34_lateral", func(t *testing.T) {
		nb := e.create(t, "iso-neighbour", func(s *sandbox.Spec) {
			s.Network = &api.NetworkPolicy{Egress: api.EgressAllowlist, Allow: []api.NetworkRule{{CIDR: "203.0.113.7/32", Proto: "tcp", Ports: "9"}}}
		})
		nbEP, _ := e.rt.nets.Endpoint(nb.ID())
		// The neighbour serves on 8080, and the node may connect to it.
		if err := e.rt.nets.SetPolicy(ctx, nb.ID(), network.Policy{Mode: network.ModeNone, Inbound: []network.Port{{Proto: network.ProtoTCP, Port: 8080}}}); err != nil {
			t.Fatal(err)
		}
		srv, err := nb.StartProcess(ctx, sandbox.ExecRequest{ExecRequest: api.ExecRequest{Cmd: []string{probePath, "listen", ":8080"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Signal("KILL")
		target := netip.AddrPortFrom(nbEP.Addr, 8080).String()
		hello := func() (string, error) {
			c, err := net.DialTimeout("tcp", target, time.Second)
			if err != nil {
				return "", err
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			return bufio.NewReader(c).ReadString('\n')
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			line, err := hello()
			if line == "hello\n" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("negative control: the node cannot reach the neighbour's server: %q %v", line, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// An attacker with open egress, and the main sandbox: neither
		// reaches it, nor anything else in the sandbox range.
		attacker := e.create(t, "iso-open", func(s *sandbox.Spec) { s.Network = &api.NetworkPolicy{Egress: api.EgressOpen} })
		targets := []string{target}
		base := nbEP.Addr.As4()
		for i := 1; i <= 8; i++ {
			base[3] = byte(i)
			targets = append(targets, netip.AddrPortFrom(netip.AddrFrom4(base), 8080).String())
		}
		for _, sb := range []*Sandbox{attacker, main, isolated} {
			got := probeIn(t, sb, append([]string{"connect"}, targets...)...)
			expect(t, sb.ID(), got, all(targets, notConnected...))
			e.auditedWhere(t, sb, "node-connect", "", "connect "+target, func(ev api.AuditEvent) bool { return ev.Addr == target })
		}
		// Neighbours are not listed in the sandbox's /sys (the node's
		// veths are named after their addresses).
		listed := run(t, attacker, "ls", "/sys/class/net", "/sys/devices/virtual/net").Stdout
		if strings.Contains(listed, nbEP.HostIf) {
			t.Errorf("the sandbox lists the neighbour's veth %s in /sys: %q", nbEP.HostIf, listed)
		}
		if _, err := os.Stat("/sys/class/net/" + nbEP.HostIf); err != nil {
			t.Errorf("negative control: the node does not list %s: %v", nbEP.HostIf, err)
		}
		if line, err := hello(); line != "hello\n" {
			t.Errorf("negative control, after: %q %v", line, err)
		}
	})

	t.Run("A35_raw_sockets", func(t *testing.T) {
		calls := []string{"socket:17,3,0", "socket:17,2,0", "socket:2,3,1", "socket:2,3,255", "socket:10,3,58"}
		// The isolated sandbox's root owns its namespace, but commands
		// hold no capability in it.
		for _, sb := range []*Sandbox{main, isolated} {
			expect(t, sb.ID(), probeIn(t, sb, sysArgs(calls...)...), all(calls, "EPERM"))
			e.audited(t, sb, "raw-socket", "denied", "socket")
		}
		if res := run(t, isolated, "ip", "link", "add", "d0", "type", "dummy"); res.ExitCode == 0 {
			t.Errorf("ip link add in the isolated sandbox: %+v", res)
		}
		if res := run(t, isolated, "ip", "-o", "link"); strings.Count(strings.TrimSpace(res.Stdout), "\n") != 0 || !strings.Contains(res.Stdout, "lo:") {
			t.Errorf("the isolated sandbox's links: %q, want lo alone", res.Stdout)
		}
		expect(t, "host root (negative control)", e.hostProbe(t, nil, sysArgs(calls...)...), all(calls, "OK"))
		// A forged source: the sandbox cannot even take another address.
		if res := run(t, main, "ip", "addr", "add", "198.51.100.7/32", "dev", "eth0"); res.ExitCode == 0 {
			t.Errorf("ip addr add in the sandbox: %+v", res)
		}
	})
}
