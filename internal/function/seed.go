package function

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// seedWorkspace copies the image's workspace (what a state layer of a
// snapshot holds under "workspace", merged with the layers below it,
// deletions included) into a new sandbox's workspace. An image without
// one seeds nothing.
func seedWorkspace(imageRoot, work string) error {
	src := filepath.Join(imageRoot, workspaceInLayer)
	fi, err := os.Lstat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("seeding the workspace: %w", err)
	}
	if !fi.IsDir() {
		return nil
	}
	var dirs []string // to time last, deepest first
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		dst := filepath.Join(work, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if rel != "." {
				if err := os.Mkdir(dst, 0o700); err != nil {
					return err
				}
			}
			dirs = append(dirs, rel)
			return os.Chmod(dst, fi.Mode().Perm()|fi.Mode()&(fs.ModeSetgid|fs.ModeSticky))
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(t, dst)
		case fi.Mode().IsRegular():
			if err := copyRegular(p, dst, fi); err != nil {
				return err
			}
			return os.Chtimes(dst, fi.ModTime(), fi.ModTime())
		}
		return nil // nothing else is in a layer
	})
	if err != nil {
		return fmt.Errorf("seeding the workspace: %w", err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		fi, err := os.Lstat(filepath.Join(src, dirs[i]))
		if err != nil {
			return fmt.Errorf("seeding the workspace: %w", err)
		}
		t := fi.ModTime()
		if err := os.Chtimes(filepath.Join(work, dirs[i]), t, t); err != nil {
			return fmt.Errorf("seeding the workspace: %w", err)
		}
	}
	return nil
}

func copyRegular(src, dst string, fi fs.FileInfo) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Chmod(dst, fi.Mode().Perm())
}
