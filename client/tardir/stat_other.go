//go:build !unix

package tardir

import "io/fs"

func statOf(fi fs.FileInfo) stat { return fallbackStat(fi) }
