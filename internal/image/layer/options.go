package layer

// Defaults for BuildOptions' zero values.
const (
	DefaultMaxBytes   = 64 << 30
	DefaultMaxEntries = 1_000_000
	DefaultPlatform   = "linux/amd64"
)

// BuildOptions tune a build. The zero value is valid.
type BuildOptions struct {
	// TempDir holds scratch files (an OCI layout unpacked from a tar
	// archive); empty means os.TempDir().
	TempDir string
	// MaxBytes bounds the bytes read from an archive after decompression
	// and the sum of the file sizes it declares; 0 means DefaultMaxBytes.
	MaxBytes int64
	// MaxEntries bounds the entries of an archive (all layers of an image
	// together); 0 means DefaultMaxEntries.
	MaxEntries int
	// Platform selects the image of a multi-platform OCI index, as
	// "os/arch" or "os/arch/variant"; empty means DefaultPlatform.
	Platform string
}

func (o BuildOptions) withDefaults() BuildOptions {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.Platform == "" {
		o.Platform = DefaultPlatform
	}
	return o
}
