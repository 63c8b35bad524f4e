package builtin

import (
	"fmt"
	"os"
	"path/filepath"
)

// Owners of the files the built-in layers write.
const (
	rootID = 0
	userID = 1000 // "user", the non-root account of the base layers
)

// tree writes entries under a root directory with exact modes and owners,
// whatever the process's umask and the parent directory's setgid bit, so
// that the same calls give the same tree on any host.
type tree struct {
	root string
}

func (t tree) path(name string) string { return filepath.Join(t.root, filepath.FromSlash(name)) }

// dir creates directory name (and missing parents, 0755 root) with mode
// and owner uid:gid; an existing directory gets them too.
func (t tree) dir(name string, mode os.FileMode, uid, gid int) error {
	p := t.path(name)
	if parent := filepath.Dir(name); parent != "." && parent != "/" {
		if _, err := os.Lstat(t.path(parent)); os.IsNotExist(err) {
			if err := t.dir(parent, 0o755, rootID, rootID); err != nil {
				return err
			}
		}
	}
	if err := os.Mkdir(p, 0o700); err != nil && !os.IsExist(err) {
		return err
	}
	return t.own(p, mode, uid, gid)
}

// file writes content to name, mode perm, owned by root.
func (t tree) file(name string, content []byte, mode os.FileMode) error {
	if err := t.dir(filepath.Dir(name), 0o755, rootID, rootID); err != nil {
		return err
	}
	p := t.path(name)
	if err := os.WriteFile(p, content, 0o600); err != nil {
		return err
	}
	return t.own(p, mode, rootID, rootID)
}

// symlink makes name a symbolic link to target, owned by root.
func (t tree) symlink(target, name string) error {
	if err := t.dir(filepath.Dir(name), 0o755, rootID, rootID); err != nil {
		return err
	}
	p := t.path(name)
	if err := os.Symlink(target, p); err != nil {
		return err
	}
	return os.Lchown(p, rootID, rootID)
}

func (t tree) own(p string, mode os.FileMode, uid, gid int) error {
	if err := os.Lchown(p, uid, gid); err != nil {
		return fmt.Errorf("setting the owner of %s (built-in layers are built as root): %w", p, err)
	}
	// Chmod after Chown: chown clears the setuid and setgid bits.
	return os.Chmod(p, mode)
}

// accountFiles are /etc/passwd and /etc/group with root and user (1000).
func accountFiles(shell string) map[string]string {
	return map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:" + shell + "\n" +
			"user:x:1000:1000:user:/home/user:" + shell + "\n",
		"etc/group": "root:x:0:\nuser:x:1000:\n",
	}
}

// hostsFile is /etc/hosts of the base layers.
const hostsFile = `127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
`
