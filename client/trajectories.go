package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"

	"github.com/dsec-dev/dsec/api"
)

var errEmptyTrajectoryID = errors.New("trajectory ID is empty")

// trajectoryPath returns /v1/trajectories/{id}{suffix}. A trajectory ID
// contains '/' ("run-42/task-7/rollout-3"): it travels as one path
// segment, '/' escaped as %2F, which is how the server matches it.
func trajectoryPath(id, suffix string) (string, error) {
	if id == "" {
		return "", errEmptyTrajectoryID
	}
	return "/v1/trajectories/" + url.PathEscape(id) + suffix, nil
}

// Trajectory returns the head of the trajectory id: its state, sandbox,
// step count, snapshots and incarnations. An unknown one is ErrNotFound.
func (c *Client) Trajectory(ctx context.Context, id string) (api.Trajectory, error) {
	p, err := trajectoryPath(id, "")
	if err != nil {
		return api.Trajectory{}, err
	}
	var t api.Trajectory
	err = c.call(ctx, http.MethodGet, p, nil, &t, 0)
	return t, err
}

// ListTrajectories returns one page of the token's trajectories: the one
// after pageToken ("" for the first), of at most limit (0: the server's
// default).
func (c *Client) ListTrajectories(ctx context.Context, pageToken string, limit int) (api.TrajectoryList, error) {
	q := url.Values{}
	if pageToken != "" {
		q.Set("page_token", pageToken)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	p := "/v1/trajectories"
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var l api.TrajectoryList
	err := c.call(ctx, http.MethodGet, p, nil, &l, 0)
	return l, err
}

// TrajectorySteps returns a page of the trajectory id's steps, in order:
// those after step number after (0: from the first), at most limit (0: the
// server's default). While more follow, NextPageToken is the page's last
// step number, to pass as after.
func (c *Client) TrajectorySteps(ctx context.Context, id string, after, limit int) (api.TrajectorySteps, error) {
	p, err := trajectoryPath(id, "/steps")
	if err != nil {
		return api.TrajectorySteps{}, err
	}
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.Itoa(after))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var s api.TrajectorySteps
	err = c.call(ctx, http.MethodGet, p, nil, &s, 0)
	return s, err
}

// AllTrajectorySteps yields every step of the trajectory id after step
// number after, in order, page by page. It stops at the first error,
// which it yields with a zero step.
func (c *Client) AllTrajectorySteps(ctx context.Context, id string, after int) iter.Seq2[api.TrajectoryStep, error] {
	return func(yield func(api.TrajectoryStep, error) bool) {
		for {
			page, err := c.TrajectorySteps(ctx, id, after, 0)
			if err != nil {
				yield(api.TrajectoryStep{}, err)
				return
			}
			for _, s := range page.Steps {
				if !yield(s, nil) {
					return
				}
			}
			if page.NextPageToken == "" {
				return
			}
			next, err := strconv.Atoi(page.NextPageToken)
			// A token that does not move forward would loop for ever.
			if err != nil || next <= after {
				yield(api.TrajectoryStep{}, fmt.Errorf("reading steps of %s: server sent page token %q after step %d", id, page.NextPageToken, after))
				return
			}
			after = next
		}
	}
}

// ExportTrajectory writes every step of the trajectory id to w as JSONL,
// one api.TrajectoryStep a line, in order, as the server streams it. Only
// ctx bounds the download.
func (c *Client) ExportTrajectory(ctx context.Context, id string, w io.Writer) error {
	p, err := trajectoryPath(id, "/export")
	if err != nil {
		return err
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: p, accept: hdrNDJSON})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("exporting %s: %w", id, err)
	}
	return nil
}

// ReadTrajectoryExport decodes an export (JSONL) into its steps.
func ReadTrajectoryExport(r io.Reader) ([]api.TrajectoryStep, error) {
	var out []api.TrajectoryStep
	dec := json.NewDecoder(r)
	for {
		var s api.TrajectoryStep
		if err := dec.Decode(&s); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("reading step %d of the export: %w", len(out)+1, err)
		}
		out = append(out, s)
	}
}

// TrajectoryBlob opens a blob of the trajectory id for streaming: a long
// output (a step's StdoutBlob, StderrBlob) or a written file's content
// (StepFile.Digest). The caller must close it; only ctx bounds the
// download.
func (c *Client) TrajectoryBlob(ctx context.Context, id, digest string) (io.ReadCloser, error) {
	if digest == "" {
		return nil, errors.New("blob digest is empty")
	}
	p, err := trajectoryPath(id, "/blobs/"+url.PathEscape(digest))
	if err != nil {
		return nil, err
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: p, accept: hdrOctet})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// DeleteTrajectory deletes the trajectory id, its steps and its blobs
// (those a snapshot in use holds stay).
func (c *Client) DeleteTrajectory(ctx context.Context, id string) error {
	p, err := trajectoryPath(id, "")
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, 0)
}

// Resume rebuilds the trajectory id in a new sandbox (POST …/resume): from
// its latest snapshot unless req.FromScratch, replaying the logged steps
// that changed state, in order. A replayed step whose result differs from
// the log is in ResumeResult.Divergence; with OnDivergence "stop" (the
// default) the sandbox is kept where it diverged. Like a create, a resume
// refused with 429, or 503 with Retry-After, made nothing and is retried;
// any other failure is returned as it is.
func (c *Client) Resume(ctx context.Context, id string, req api.ResumeRequest) (api.ResumeResult, error) {
	p, err := trajectoryPath(id, "/resume")
	if err != nil {
		return api.ResumeResult{}, err
	}
	var r api.ResumeResult
	err = c.call(ctx, http.MethodPost, p, req, &r, resumeWait)
	return r, err
}
