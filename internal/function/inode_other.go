//go:build !unix

package function

import "io/fs"

func inode(fs.FileInfo) uint64 { return 0 }

func isNotDir(error) bool { return false }
