package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/client/tardir"
)

func (a *app) layerBuildCmd() *cobra.Command {
	var (
		name  string
		local bool
		kind  string
	)
	cmd := &cobra.Command{
		Use:   "build SRC --name NAME:VERSION",
		Short: "Build a layer from a directory, a tar archive or an OCI image",
		Long: `Build a layer from SRC and print its ID. SRC is

  a directory         packed here as a tar and streamed to the server (with
                      --local the server reads the directory itself: the path
                      must name it as the server sees it);
  an OCI image layout a directory with an oci-layout file, packed as a tar
                      and sent as kind oci;
  a tar file          .tar or .tar.gz, sent as it is (kind tar);
  an OCI archive      a "docker save" .tar or an OCI layout .tar (one with a
                      manifest.json or oci-layout at its top): kind oci, its
                      layers flattened into one.

--kind tar|oci overrides the detection. On a terminal a progress line shows
the bytes sent, the rate and the time taken.`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if kind != "" && kind != client.KindTar && kind != client.KindOCI {
				return usagef("--kind %q: want tar or oci", kind)
			}
			src := argv[0]
			fi, err := os.Stat(src)
			if err != nil {
				return err
			}
			if local {
				return a.buildLocalLayer(cmd, src, fi, name, kind)
			}
			var (
				body  io.Reader
				total int64 = -1
				pack  *packError
			)
			switch {
			case fi.IsDir():
				if kind == "" {
					kind = dirKind(src)
				}
				rc := tardir.Open(src)
				defer rc.Close()
				pack = &packError{r: rc}
				body = pack
			case fi.Mode().IsRegular():
				f, err := os.Open(src)
				if err != nil {
					return err
				}
				defer f.Close()
				if kind == "" {
					if kind, err = archiveKind(f); err != nil {
						return err
					}
				}
				body, total = f, fi.Size()
			default:
				return fmt.Errorf("%s is neither a directory nor a regular file", src)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			p := a.newProgress(cmd.ErrOrStderr(), filepath.Base(filepath.Clean(src)), total)
			counted := io.Reader(progressReader{body, p})
			if total >= 0 {
				counted = sizedProgressReader{progressReader{body, p}}
			}
			l, err := c.ImportLayer(cmd.Context(), kind, counted, name)
			if err != nil {
				if perr := pack.err(); perr != nil {
					return fmt.Errorf("packing %s: %w", src, perr)
				}
				return err
			}
			p.done()
			return a.printLayer(cmd, l)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&name, "name", "", "name:version to give the layer (e.g. team/ws:1)")
	fs.BoolVar(&local, "local", false, "have the server build the layer from directory SRC on its own host")
	fs.StringVar(&kind, "kind", "", "archive kind, tar or oci (default: detected)")
	return cmd
}

// buildLocalLayer has the server build the layer from the directory src.
func (a *app) buildLocalLayer(cmd *cobra.Command, src string, fi os.FileInfo, name, kind string) error {
	if !fi.IsDir() {
		return usagef("--local takes a directory; %s is not one", src)
	}
	if kind == client.KindOCI || (kind == "" && dirKind(src) == client.KindOCI) {
		return usagef("--local builds a plain directory; upload an OCI image layout without --local")
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return err
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	l, err := c.BuildDirLayer(cmd.Context(), abs, name)
	if err != nil {
		return err
	}
	return a.printLayer(cmd, l)
}

func (a *app) printLayer(cmd *cobra.Command, l *api.Layer) error {
	if a.json {
		return printJSON(cmd.OutOrStdout(), l)
	}
	_, err := fmt.Fprintln(cmd.OutOrStdout(), l.ID)
	return err
}

// dirKind is the kind of the upload of directory dir: oci for an OCI image
// layout (it has an oci-layout file), else tar.
func dirKind(dir string) string {
	if fi, err := os.Stat(filepath.Join(dir, "oci-layout")); err == nil && fi.Mode().IsRegular() {
		return client.KindOCI
	}
	return client.KindTar
}

// archiveKind reads the tar (or gzip-compressed tar) f and returns oci if
// it has a manifest.json (docker save) or an oci-layout (OCI image layout)
// at its top, else tar: a file that is no tar at all is left for the
// server to refuse. It rewinds f. An uncompressed archive's contents are
// skipped by seeking; a compressed one is read through.
func archiveKind(f *os.File) (string, error) {
	var magic [2]byte
	n, err := f.ReadAt(magic[:], 0)
	if err != nil && err != io.EOF {
		return "", err
	}
	var r io.Reader = f
	if bytes.Equal(magic[:n], []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return "", err
		}
		defer gz.Close()
		r = gz
	}
	kind := client.KindTar
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err != nil {
			break // the end, or not a tar: the server will say
		}
		if top := strings.TrimPrefix(path.Clean("/"+h.Name), "/"); top == "manifest.json" || top == "oci-layout" {
			kind = client.KindOCI
			break
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	return kind, nil
}

// packError remembers the first error reading the tar of a directory, so
// that a file Write refused is reported as such rather than as a failed
// upload. It is safe for concurrent use; a nil *packError has no error.
type packError struct {
	r io.Reader

	mu    sync.Mutex // guards following fields
	first error
}

func (p *packError) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if err != nil && !errors.Is(err, io.EOF) {
		p.mu.Lock()
		if p.first == nil {
			p.first = err
		}
		p.mu.Unlock()
	}
	return n, err
}

func (p *packError) err() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first
}
