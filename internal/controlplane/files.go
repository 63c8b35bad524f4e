package controlplane

import (
	"context"
	"io"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/noderpc"
)

// File operations route to the sandbox's node, which resolves relative
// paths against the working directory (sandbox.Workdir) and confines them
// to the tier's file root.

func (m *Manager) OpenFile(ctx context.Context, owner, id, path string) (io.ReadCloser, api.FileInfo, error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return nil, api.FileInfo{}, err
	}
	return m.nodes.OpenFile(ctx, rec.Node, id, path)
}

// WriteFile streams r to path; the write is atomic on the node.
func (m *Manager) WriteFile(ctx context.Context, owner, id, path string, r io.Reader, mode uint32, parents bool) (api.FileInfo, error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return api.FileInfo{}, err
	}
	opt := noderpc.FileRequest{Mode: mode, Parents: parents, MaxBytes: m.lim.MaxFileBytes}
	if rec.Trajectory == "" {
		return m.nodes.WriteFile(ctx, rec.Node, id, path, r, opt)
	}
	return m.recordedWrite(ctx, rec, path, r, opt)
}

func (m *Manager) ListFiles(ctx context.Context, owner, id, path string, depth int) ([]api.FileInfo, error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return nil, err
	}
	return m.nodes.ListFiles(ctx, rec.Node, id, path, depth)
}

func (m *Manager) StatFile(ctx context.Context, owner, id, path string) (api.FileInfo, error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return api.FileInfo{}, err
	}
	return m.nodes.Stat(ctx, rec.Node, id, path)
}

func (m *Manager) Mkdir(ctx context.Context, owner, id, path string, parents bool) (api.FileInfo, error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return api.FileInfo{}, err
	}
	var fi api.FileInfo
	err = m.stepped(ctx, rec, api.TrajectoryStep{Kind: api.KindMkdir, File: &api.StepFile{Path: path, Parents: parents}}, func(int) error {
		fi, err = m.nodes.Mkdir(ctx, rec.Node, id, path, parents)
		return err
	})
	if err == nil && fi.Path == "" {
		// Answered from the log: the directory is there already.
		return m.nodes.Stat(ctx, rec.Node, id, path)
	}
	return fi, err
}

func (m *Manager) RemoveFile(ctx context.Context, owner, id, path string, recursive bool) error {
	rec, err := m.running(owner, id)
	if err != nil {
		return err
	}
	return m.stepped(ctx, rec, api.TrajectoryStep{Kind: api.KindRemove, File: &api.StepFile{Path: path, Recursive: recursive}}, func(int) error {
		return m.nodes.Remove(ctx, rec.Node, id, path, recursive)
	})
}

func (m *Manager) Rename(ctx context.Context, owner, id, from, to string) (api.FileInfo, error) {
	rec, err := m.running(owner, id)
	if err != nil {
		return api.FileInfo{}, err
	}
	var fi api.FileInfo
	err = m.stepped(ctx, rec, api.TrajectoryStep{Kind: api.KindRename, File: &api.StepFile{Path: from, To: to}}, func(int) error {
		fi, err = m.nodes.Rename(ctx, rec.Node, id, from, to)
		return err
	})
	if err == nil && fi.Path == "" {
		return m.nodes.Stat(ctx, rec.Node, id, to)
	}
	return fi, err
}
