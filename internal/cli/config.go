package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/dsec-dev/dsec/client"
)

// client returns a client of the server named by --url, DSEC_URL or the
// default, authenticated with the token resolveToken finds.
func (a *app) client() (*client.Client, error) {
	u := a.url
	if u == "" {
		u, _ = a.env.lookupEnv("DSEC_URL")
	}
	if u == "" {
		u = defaultURL
	}
	tok, err := a.resolveToken()
	if err != nil {
		return nil, err
	}
	return client.New(u, tok, client.WithUserAgent("dsec/"+a.version), client.WithTimeout(a.timeout))
}

// resolveToken returns the token of --token, else of DSEC_TOKEN, else the
// content of token in the data directory ($DSEC_DATA_DIR or
// /var/lib/dsec), which a local `dsec up` writes. No token at all is not an
// error: the server will say whether it needs one.
func (a *app) resolveToken() (string, error) {
	if a.token != "" {
		return a.token, nil
	}
	if t, ok := a.env.lookupEnv("DSEC_TOKEN"); ok && t != "" {
		return t, nil
	}
	dir, ok := a.env.lookupEnv("DSEC_DATA_DIR")
	if !ok || dir == "" {
		dir = a.env.dataDir
	}
	path := filepath.Join(dir, "token")
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		return strings.TrimSpace(string(b)), nil
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, fs.ErrPermission):
		return "", nil
	default:
		return "", fmt.Errorf("reading token: %w", err)
	}
}
