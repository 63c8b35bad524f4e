package network

import (
	"bufio"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// normalise fills in the defaults of opt and checks it.
func normalise(opt Options) (Options, error) {
	bad := func(format string, args ...any) (Options, error) {
		return opt, errdefs.New(errdefs.Invalid, api.CodeInvalidNetworkOptions, format, args...)
	}
	if !opt.Range.IsValid() {
		opt.Range = DefaultRange
	}
	opt.Range = opt.Range.Masked()
	if !opt.Range.Addr().Is4() {
		return bad("network range %s: want IPv4", opt.Range)
	}
	if opt.PoolSize == 0 {
		opt.PoolSize = DefaultPoolSize
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.Resolver == nil {
		opt.Resolver = net.DefaultResolver
	}
	if opt.Name == "" {
		opt.Name = DefaultName
	}
	if len(opt.Name) > 7 || strings.IndexFunc(opt.Name, func(r rune) bool {
		return !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || 'A' <= r && r <= 'Z')
	}) >= 0 {
		return bad("network name %q: want at most 7 letters and digits", opt.Name)
	}
	if !opt.Gateway.IsValid() {
		opt.Gateway = DefaultGateway
	}
	if !opt.Gateway.Is4() || !opt.Gateway.IsLinkLocalUnicast() {
		return bad("gateway %s: want an IPv4 link-local address", opt.Gateway)
	}
	if opt.NetnsDir == "" {
		opt.NetnsDir = DefaultNetnsDir
	}
	if opt.StateDir == "" {
		opt.StateDir = DefaultStateDir
	}
	for _, d := range opt.Deny {
		if !d.IsValid() || !d.Addr().Is4() {
			return bad("deny prefix %s: want IPv4", d)
		}
	}
	if opt.DNS == nil {
		opt.DNS = resolvConf("/etc/resolv.conf")
	}
	var dns []netip.Addr
	for _, a := range opt.DNS {
		if a = a.Unmap(); a.Is4() {
			dns = append(dns, a)
		}
	}
	opt.DNS = dns
	opt.HostIfaces = append([]string(nil), opt.HostIfaces...)
	return opt, nil
}

// resolvConf returns the IPv4 nameservers of a resolv.conf file.
func resolvConf(path string) []netip.Addr {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil && a.Unmap().Is4() {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}

// checkID accepts sandbox IDs that make safe file names.
func checkID(id string) error {
	if id == "" || len(id) > 128 || id[0] == '.' || strings.IndexFunc(id, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-' || r == '_' || r == '.')
	}) >= 0 {
		return errdefs.New(errdefs.Invalid, api.CodeInvalidSandboxID, "sandbox id %q: want 1-128 letters, digits, '-', '_' or '.'", id)
	}
	return nil
}
