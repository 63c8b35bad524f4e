package layer

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Limits of the hardened tar reader that are not options.
const (
	maxPathLen      = 4096  // bytes in an entry or link name
	maxNameLen      = 255   // bytes in one path component (EROFS_NAME_LEN)
	maxSymlinkLen   = 4095  // bytes in a symlink target (PATH_MAX - 1)
	maxXattrsSize   = 65536 // bytes of xattr names and values per entry
	maxXattrNameLen = 255
	maxXattrValue   = 65535 // EROFS stores the value size in 16 bits
)

// Entry kinds of the hardened reader.
const (
	kindFile     = 'f'
	kindDir      = 'd'
	kindSymlink  = 'l'
	kindHardlink = 'h'
)

// tarEntry is a tar header that passed the hardened reader's checks.
type tarEntry struct {
	Path   string // cleaned, relative, no "." or ".." components; "" is the root
	Kind   byte
	Mode   uint32 // permission bits with setuid, setgid and sticky
	UID    uint32
	GID    uint32
	Size   int64             // regular files only
	Link   string            // symlink target as given, or the cleaned hard link target
	Xattrs map[string]string // from PAX SCHILY.xattr.* records
}

// tarReader reads an untrusted tar stream, optionally gzip-compressed.
// Every header is checked before it is returned: paths are relative and
// free of "..", names and records are bounded, device nodes and FIFOs are
// refused, and the entries and bytes read are counted against the
// options' limits (shared by all layers of an image through budget). It
// hashes the bytes as given and the tar stream after decompression.
type tarReader struct {
	raw    *hashCounter // the bytes as given
	plain  *hashCounter // the tar stream after decompression
	tr     *tar.Reader
	budget *budget
	gz     *gzip.Reader
}

// budget is what an image's archives may still use.
type budget struct {
	maxBytes   int64
	maxEntries int
	entries    int
	declared   int64 // sum of file sizes declared by headers
	read       int64 // decompressed bytes of the archives finished so far
}

func newBudget(opt BuildOptions) *budget {
	return &budget{maxBytes: opt.MaxBytes, maxEntries: opt.MaxEntries}
}

// hashCounter hashes and counts what passes through it; past limit
// bytes it fails with a TooLarge error. Errors of the underlying reader
// are remembered so they are not mistaken for malformed input.
type hashCounter struct {
	r      io.Reader
	h      hash.Hash
	n      int64
	limit  int64 // < 0: none
	srcErr error
}

func tooLarge() error {
	return errdefs.New(errdefs.TooLarge, api.CodeTarTooLarge, "the archive is larger than the allowed size")
}

func (c *hashCounter) Read(p []byte) (int, error) {
	if c.limit >= 0 {
		// Let one byte more than allowed through, so that reaching the
		// limit exactly is not an error but passing it is.
		if c.n > c.limit {
			return 0, tooLarge()
		}
		if room := c.limit - c.n + 1; int64(len(p)) > room {
			p = p[:room]
		}
	}
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if c.limit >= 0 && c.n > c.limit {
		return 0, tooLarge()
	}
	if err != nil && err != io.EOF && c.srcErr == nil {
		c.srcErr = err
	}
	return n, err
}

func (c *hashCounter) digest() string { return "sha256:" + hex.EncodeToString(c.h.Sum(nil)) }

// newTarReader starts reading r. Gzip is recognised by its magic bytes.
func newTarReader(r io.Reader, b *budget) (*tarReader, error) {
	raw := &hashCounter{r: r, h: sha256.New(), limit: -1}
	br := bufio.NewReaderSize(raw, 64<<10)
	t := &tarReader{raw: raw, budget: b}
	var plain io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, t.classify(err)
		}
		gz.Multistream(true)
		t.gz = gz
		plain = gz
	}
	t.plain = &hashCounter{r: plain, h: sha256.New(), limit: max(0, b.maxBytes-b.read)}
	t.tr = tar.NewReader(t.plain)
	return t, nil
}

// classify turns a read error into a classified one.
func (t *tarReader) classify(err error) error {
	var e *errdefs.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &e):
		return err
	case t.raw.srcErr != nil:
		return fmt.Errorf("reading archive: %w", t.raw.srcErr) // not the archive's fault
	case errors.Is(err, tar.ErrFieldTooLong):
		return errdefs.Wrap(errdefs.Invalid, api.CodeTarHeaderTooLarge, err, "an archive header is too large")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errdefs.Wrap(errdefs.Invalid, api.CodeTarTruncated, err, "the archive is truncated")
	}
	return errdefs.Wrap(errdefs.Invalid, api.CodeTarMalformed, err, "the archive is not a valid tar stream")
}

// Next returns the next entry, or io.EOF after the last one. Global PAX
// headers are skipped. A regular file's data is read with Read.
func (t *tarReader) Next() (*tarEntry, error) {
	for {
		hdr, err := t.tr.Next()
		if err == io.EOF {
			return nil, io.EOF
		}
		if err != nil {
			return nil, t.classify(err)
		}
		if t.budget.entries++; t.budget.entries > t.budget.maxEntries {
			return nil, errdefs.New(errdefs.TooLarge, api.CodeTarTooManyEntries, "the archive has more than %d entries", t.budget.maxEntries)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		return t.check(hdr)
	}
}

func (t *tarReader) Read(p []byte) (int, error) {
	n, err := t.tr.Read(p)
	if err != nil && err != io.EOF {
		return n, t.classify(err)
	}
	return n, err
}

// Finish reads what is left of the stream (so the digests cover all of
// it, within the byte limit) and returns the digests of the bytes as
// given and of the decompressed tar stream.
func (t *tarReader) Finish() (raw, plain string, err error) {
	if _, err := io.Copy(io.Discard, t.plain); err != nil {
		return "", "", t.classify(err)
	}
	t.budget.read += t.plain.n
	if t.gz != nil {
		// Bytes after the gzip stream ends are not part of it; hash them
		// as given all the same.
		if _, err := io.Copy(io.Discard, t.raw); err != nil {
			return "", "", t.classify(err)
		}
	}
	return t.raw.digest(), t.plain.digest(), nil
}

func unsafePath(name, why string) error {
	return errdefs.New(errdefs.Invalid, api.CodeTarUnsafePath, "archive entry %q: %s", truncName(name), why)
}

func truncName(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// cleanTarPath returns name relative to the root with "." components and
// empty components dropped, or an error if it is absolute, climbs with
// "..", or is too long.
func cleanTarPath(name string) (string, error) {
	if len(name) > maxPathLen {
		return "", errdefs.New(errdefs.Invalid, api.CodeTarNameTooLong, "archive entry name of %d bytes (limit %d)", len(name), maxPathLen)
	}
	if strings.HasPrefix(name, "/") {
		return "", unsafePath(name, "absolute path")
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", unsafePath(name, "NUL in name")
	}
	parts := strings.Split(name, "/")
	out := parts[:0]
	for _, p := range parts {
		switch p {
		case "", ".":
			continue
		case "..":
			return "", unsafePath(name, `".." component`)
		}
		if len(p) > maxNameLen {
			return "", errdefs.New(errdefs.Invalid, api.CodeTarNameTooLong, "archive entry %q has a component of %d bytes (limit %d)", truncName(name), len(p), maxNameLen)
		}
		out = append(out, p)
	}
	return strings.Join(out, "/"), nil
}

func (t *tarReader) check(hdr *tar.Header) (*tarEntry, error) {
	p, err := cleanTarPath(hdr.Name)
	if err != nil {
		return nil, err
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || int64(hdr.Uid) > 1<<32-2 || int64(hdr.Gid) > 1<<32-2 {
		return nil, errdefs.New(errdefs.Invalid, api.CodeTarMalformed, "archive entry %q has owner %d:%d", truncName(hdr.Name), hdr.Uid, hdr.Gid)
	}
	e := &tarEntry{Path: p, Mode: uint32(hdr.Mode) & 0o7777, UID: uint32(hdr.Uid), GID: uint32(hdr.Gid)}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeCont:
		e.Kind = kindFile
		if hdr.Size < 0 {
			return nil, errdefs.New(errdefs.Invalid, api.CodeTarMalformed, "archive entry %q has size %d", truncName(hdr.Name), hdr.Size)
		}
		if hdr.Size > t.budget.maxBytes-t.budget.declared {
			return nil, errdefs.New(errdefs.TooLarge, api.CodeTarTooLarge, "archive entry %q of %d bytes exceeds the size limit of %d bytes", truncName(hdr.Name), hdr.Size, t.budget.maxBytes)
		}
		t.budget.declared += hdr.Size
		e.Size = hdr.Size
	case tar.TypeDir:
		e.Kind = kindDir
	case tar.TypeSymlink:
		e.Kind = kindSymlink
		if hdr.Linkname == "" || len(hdr.Linkname) > maxSymlinkLen || strings.IndexByte(hdr.Linkname, 0) >= 0 {
			return nil, errdefs.New(errdefs.Invalid, api.CodeTarMalformed, "archive symlink %q has an empty or overlong target", truncName(hdr.Name))
		}
		e.Link = hdr.Linkname
	case tar.TypeLink:
		e.Kind = kindHardlink
		l, err := cleanTarPath(hdr.Linkname)
		if err != nil || l == "" || strings.HasPrefix(hdr.Linkname, "/") {
			return nil, errdefs.New(errdefs.Invalid, api.CodeTarHardlink, "archive hard link %q points outside the archive (%q)", truncName(hdr.Name), truncName(hdr.Linkname))
		}
		e.Link = l
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return nil, errdefs.New(errdefs.Invalid, api.CodeTarDevice, "archive entry %q is a device node or FIFO; layers cannot hold them", truncName(hdr.Name))
	default:
		return nil, errdefs.New(errdefs.Invalid, api.CodeTarUnsupportedType, "archive entry %q has unsupported type %q", truncName(hdr.Name), hdr.Typeflag)
	}
	if p == "" && e.Kind != kindDir {
		return nil, errdefs.New(errdefs.Invalid, api.CodeTarPathConflict, "archive entry %q names the root but is not a directory", truncName(hdr.Name))
	}
	xs, err := tarXattrs(hdr)
	if err != nil {
		return nil, err
	}
	e.Xattrs = xs
	return e, nil
}

// Xattr name prefixes EROFS and go-erofs encode faithfully. POSIX ACLs
// ("system.posix_acl_*") are not among them in go-erofs v0.3.1.
var xattrPrefixes = []string{"user.", "trusted.", "security."}

// tarXattrs collects PAX SCHILY.xattr.* records. Overlay's own xattrs
// are refused: in a lower layer they would steer overlayfs (redirects,
// metacopy) from inside an untrusted image.
func tarXattrs(hdr *tar.Header) (map[string]string, error) {
	var xs map[string]string
	total := 0
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		bad := func(why string) error {
			return errdefs.New(errdefs.Invalid, api.CodeTarXattr, "archive entry %q: xattr %q %s", truncName(hdr.Name), truncName(name), why)
		}
		known := false
		for _, p := range xattrPrefixes {
			if strings.HasPrefix(name, p) && len(name) > len(p) {
				known = true
			}
		}
		switch {
		case !known:
			return nil, bad("is not a user., trusted. or security. attribute")
		case strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay."):
			return nil, bad("is reserved for overlayfs")
		case len(name) > maxXattrNameLen || len(v) > maxXattrValue:
			return nil, bad("is too long")
		}
		if total += len(name) + len(v); total > maxXattrsSize {
			return nil, bad("exceeds the xattr space of an entry")
		}
		if xs == nil {
			xs = map[string]string{}
		}
		xs[name] = v
	}
	return xs, nil
}
