package layer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/dsec-dev/dsec/internal/testenv"
)

// benchTree writes the benchmark tree: about 200 MiB of seeded random
// data, 60% of it in about 2,000 files of 60-64 KiB spread over 40
// directories, the rest in four 20 MiB files. It returns the data size.
func benchTree(b *testing.B, dir string) int64 {
	b.Helper()
	r := rand.New(rand.NewPCG(7, 11))
	var total int64
	const small = 120 << 20
	for i := 0; total < small; i++ {
		n := 60<<10 + r.IntN(4<<10)
		mustWrite(b, filepath.Join(dir, fmt.Sprintf("d%02d/f%04d", i%40, i)), testenv.RandBytes(uint64(i), n), 0o644)
		total += int64(n)
	}
	for i := range 4 {
		mustWrite(b, filepath.Join(dir, fmt.Sprintf("large/l%d.bin", i)), testenv.RandBytes(uint64(1000+i), 20<<20), 0o644)
		total += 20 << 20
	}
	return total
}

func reportSizes(b *testing.B, a Artifact, total int64) {
	b.ReportMetric(float64(a.Manifest.Meta.Size), "meta-bytes")
	b.ReportMetric(float64(a.Manifest.Blob.Size), "blob-bytes")
	b.ReportMetric(100*float64(a.Manifest.Meta.Size)/float64(total), "meta-%")
}

// BenchmarkBuildDir200MB builds the tree with mkfs.erofs; the time
// includes hashing the source, mkfs, hashing the outputs and Validate
// (fsck.erofs reads the whole blob).
func BenchmarkBuildDir200MB(b *testing.B) {
	requireMkfs(b)
	src := b.TempDir()
	total := benchTree(b, src)
	b.SetBytes(total)
	ctx := context.Background()
	var a Artifact
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out := filepath.Join(b.TempDir(), "out")
		var err error
		if a, err = BuildDir(ctx, src, out, BuildOptions{}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		reportSizes(b, a, total)
		os.RemoveAll(out)
		b.StartTimer()
	}
}

// BenchmarkBuildTar builds the same tree from an uncompressed tar file
// with go-erofs (the time includes Validate, as above).
func BenchmarkBuildTar(b *testing.B) {
	src := b.TempDir()
	total := benchTree(b, src)
	archive := filepath.Join(b.TempDir(), "tree.tar")
	tarDir(b, src, archive)
	if err := os.RemoveAll(src); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(total)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := os.Open(archive)
		if err != nil {
			b.Fatal(err)
		}
		out := filepath.Join(b.TempDir(), "out")
		a, err := BuildTar(ctx, f, out, BuildOptions{})
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		reportSizes(b, a, total)
		os.RemoveAll(out)
		b.StartTimer()
	}
}
