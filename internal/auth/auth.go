// Package auth issues and checks DSec's API bearer tokens. A token is 32
// random bytes in base64url with a "dsec_" prefix; the server keeps it in
// a 0600 file in the data directory and identifies the owner of each
// sandbox by a hash of the token, never the token itself.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// TokenFile is the token's file name in the data directory.
const TokenFile = "token"

// NewToken returns a fresh random token.
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating token: %w", err)
	}
	return "dsec_" + base64.RawURLEncoding.EncodeToString(b), nil
}

// LoadOrCreate reads the API token in dir, creating it (mode 0600) if
// absent. created reports whether it was made now.
func LoadOrCreate(dir string) (token string, created bool, err error) {
	return LoadOrCreateAt(filepath.Join(dir, TokenFile))
}

// LoadOrCreateAt is LoadOrCreate for a token file at path.
func LoadOrCreateAt(path string) (token string, created bool, err error) {
	tok, err := loadFile(path)
	if err == nil {
		return tok, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", false, err
	}
	if tok, err = NewToken(); err != nil {
		return "", false, err
	}
	// O_EXCL: two processes starting at once must not each write a token.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		tok, err := loadFile(path)
		return tok, false, err
	}
	if err != nil {
		return "", false, fmt.Errorf("creating token file: %w", err)
	}
	if _, err := f.WriteString(tok + "\n"); err != nil {
		f.Close()
		return "", false, fmt.Errorf("writing token file: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", false, fmt.Errorf("writing token file: %w", err)
	}
	return tok, true, nil
}

// Load reads the API token in dir.
func Load(dir string) (string, error) {
	return loadFile(filepath.Join(dir, TokenFile))
}

func loadFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

// Owner is the identity a token stands for in records: a hash prefix.
func Owner(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "t-" + hex.EncodeToString(sum[:8])
}

// Checker validates bearer tokens. It is safe for concurrent use (it is
// immutable).
type Checker struct {
	hashes [][32]byte
}

// NewChecker accepts the given tokens.
func NewChecker(tokens ...string) *Checker {
	c := &Checker{}
	for _, t := range tokens {
		c.hashes = append(c.hashes, sha256.Sum256([]byte(t)))
	}
	return c
}

// Check returns the owner of a valid token, or ok=false. It compares
// hashes in constant time so timing reveals nothing about the token.
func (c *Checker) Check(token string) (owner string, ok bool) {
	if token == "" {
		return "", false
	}
	h := sha256.Sum256([]byte(token))
	match := 0
	for i := range c.hashes {
		match |= subtle.ConstantTimeCompare(h[:], c.hashes[i][:])
	}
	if match != 1 {
		return "", false
	}
	return Owner(token), true
}
