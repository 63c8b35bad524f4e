//go:build !linux

package lazyblob

import (
	"context"
	"fmt"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/image/chunks"
)

// Server serves blobs as files on one FUSE mount; it runs on Linux only.
type Server struct{}

// Mount fails off Linux with an error wrapping errdefs.ErrNotSupported.
func Mount(ctx context.Context, opt Options) (*Server, error) {
	return nil, fmt.Errorf("mounting lazy blobs: %w", errdefs.ErrNotSupported)
}

func (s *Server) Add(ctx context.Context, idx chunks.Index, src Source) (string, error) {
	return "", fmt.Errorf("serving lazy blobs: %w", errdefs.ErrNotSupported)
}

func (s *Server) Remove(ctx context.Context, digest string) error {
	return fmt.Errorf("serving lazy blobs: %w", errdefs.ErrNotSupported)
}

func (s *Server) Stats() Stats { return Stats{} }

func (s *Server) CompleteFile(digest string) (string, bool) { return "", false }

func (s *Server) Dir() string { return "" }

func (s *Server) Close() error { return nil }

// Prefetch does nothing where Mount fails.
func (s *Server) Prefetch(digest string, order []int) {}

// Profile reports nothing where Mount fails.
func (s *Server) Profile(digest string) ([]int, bool) { return nil, false }
