package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dsec-dev/dsec/api"
)

func (a *app) sandboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sandbox",
		Aliases: []string{"sb"},
		Short:   "Create, list, inspect and delete sandboxes",
	}
	cmd.AddCommand(
		a.sandboxCreateCmd(),
		a.sandboxListCmd(),
		a.sandboxGetCmd(),
		a.sandboxRemoveCmd(),
		a.sandboxTimeoutCmd(),
		a.sandboxPhaseCmd(),
		a.sandboxGradeCmd(),
		a.sandboxSnapshotCmd(),
		a.sandboxForkCmd(),
	)
	return cmd
}

// createFlags are the flags that describe a new sandbox, shared by
// `sandbox create` and `run`.
type createFlags struct {
	tier     string
	image    string
	cpu      float64
	memoryMB int
	diskMB   int
	timeoutS int
	env      []string
	labels   []string
	layers   []string
	phases   string
	// Trajectories (see `dsec traj`).
	trajectory      string
	record          bool
	secretEnv       []string
	resumeOnPreempt bool
	fromSnapshot    string
	requestID       string
}

func (f *createFlags) register(fs *pflag.FlagSet, timeoutHelp string) {
	fs.StringVar(&f.tier, "tier", "", "isolation tier: function, container, microvm or vm (default function)")
	fs.StringVar(&f.image, "image", "", "image name[:tag] or ID (default: the tier's)")
	fs.Float64Var(&f.cpu, "cpu", 0, "CPU cores, may be fractional (default 1)")
	fs.IntVar(&f.memoryMB, "memory", 0, "memory limit in MB (default 256)")
	fs.IntVar(&f.diskMB, "disk", 0, "writable storage limit in MB (default 256)")
	fs.IntVar(&f.timeoutS, "timeout", 0, timeoutHelp)
	fs.StringArrayVar(&f.env, "env", nil, "environment variable K=V (repeatable)")
	fs.StringArrayVar(&f.labels, "label", nil, "label K=V (repeatable)")
	fs.StringArrayVar(&f.layers, "layer", nil, "layer ROLE=REF of an inline image instead of --image, bottom first (repeatable)")
	fs.StringVar(&f.phases, "phases", "", `the task's phases: a JSON list, or @FILE holding one ([{"name": "setup"}, {"name": "coding", "writable": ["/workspace"], "user": "1000"}, …])`)
	fs.StringVar(&f.trajectory, "trajectory", "", "record every interaction to the trajectory NAME (letters, digits and -_./:)")
	fs.BoolVar(&f.record, "record", false, "record to a trajectory with a generated name")
	fs.StringArrayVar(&f.secretEnv, "secret-env", nil, "environment variable KEY=VALUE, or KEY (its value from --env, else from this environment), whose value is never logged (repeatable)")
	fs.BoolVar(&f.resumeOnPreempt, "resume-on-preempt", false, "resume the sandbox elsewhere from its trajectory if its node is lost, drained or reclaimed")
	fs.StringVar(&f.fromSnapshot, "from-snapshot", "", "start from the snapshot ID's state instead of --image or --layer")
	fs.StringVar(&f.requestID, "request-id", "", "idempotency key: a create repeated with it within a day gets the sandbox the first made (and is retried safely)")
}

// request returns the create request the flags describe; lookup finds
// the values of --secret-env keys given alone.
func (f *createFlags) request(lookup func(string) (string, bool)) (api.CreateSandboxRequest, error) {
	env, err := parseKV("env", f.env)
	if err != nil {
		return api.CreateSandboxRequest{}, err
	}
	env, secret, err := mergeSecretEnv(env, f.secretEnv, lookup)
	if err != nil {
		return api.CreateSandboxRequest{}, err
	}
	labels, err := parseKV("label", f.labels)
	if err != nil {
		return api.CreateSandboxRequest{}, err
	}
	layers, err := parseLayers(f.layers)
	if err != nil {
		return api.CreateSandboxRequest{}, err
	}
	if f.cpu < 0 || f.memoryMB < 0 || f.diskMB < 0 || f.timeoutS < 0 {
		return api.CreateSandboxRequest{}, usagef("--cpu, --memory, --disk and --timeout must not be negative")
	}
	if f.image != "" && len(layers) > 0 {
		return api.CreateSandboxRequest{}, usagef("give --image or --layer, not both")
	}
	if f.fromSnapshot != "" && (f.image != "" || len(layers) > 0) {
		return api.CreateSandboxRequest{}, usagef("give --from-snapshot or --image/--layer, not both")
	}
	phases, err := parsePhases(f.phases)
	if err != nil {
		return api.CreateSandboxRequest{}, err
	}
	return api.CreateSandboxRequest{
		Tier:     f.tier,
		Image:    f.image,
		CPU:      f.cpu,
		MemoryMB: f.memoryMB,
		DiskMB:   f.diskMB,
		TimeoutS: f.timeoutS,
		Env:      env,
		Labels:   labels,
		Layers:   layers,
		Phases:   phases,

		Trajectory:      f.trajectory,
		Record:          f.record,
		SecretEnv:       secret,
		ResumeOnPreempt: f.resumeOnPreempt,
		FromSnapshot:    f.fromSnapshot,
		RequestID:       f.requestID,
	}, nil
}

// parsePhases reads --phases: a JSON list of phases, or @FILE.
func parsePhases(s string) ([]api.Phase, error) {
	if s == "" {
		return nil, nil
	}
	b := []byte(s)
	if name, ok := strings.CutPrefix(s, "@"); ok {
		var err error
		if b, err = os.ReadFile(name); err != nil {
			return nil, usagef("--phases: %v", err)
		}
	}
	var phases []api.Phase
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&phases); err != nil {
		return nil, usagef("--phases: a JSON list of phases: %v", err)
	}
	return phases, nil
}
