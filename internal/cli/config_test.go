package cli

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/dsec-dev/dsec/api"
)

func TestTokenDiscovery(t *testing.T) {
	writeToken := func(t *testing.T, dir, tok string) {
		if err := os.WriteFile(filepath.Join(dir, "token"), []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name  string
		flag  string
		vars  func(dataDir string) map[string]string
		files func(t *testing.T, defaultDir, dataDir string)
		want  string
	}{
		{
			name: "flag beats env and file",
			flag: "from-flag",
			vars: func(d string) map[string]string {
				return map[string]string{"DSEC_TOKEN": "from-env", "DSEC_DATA_DIR": d}
			},
			files: func(t *testing.T, _, d string) {
				writeToken(t, d, "from-file")
			},
			want: "Bearer from-flag",
		},
		{
			name: "env beats file",
			vars: func(d string) map[string]string {
				return map[string]string{"DSEC_TOKEN": "from-env", "DSEC_DATA_DIR": d}
			},
			files: func(t *testing.T, _, d string) {
				writeToken(t, d, "from-file")
			},
			want: "Bearer from-env",
		},
		{
			name: "DSEC_DATA_DIR file",
			vars: func(d string) map[string]string { return map[string]string{"DSEC_DATA_DIR": d} },
			files: func(t *testing.T, def, d string) {
				writeToken(t, d, "from-data-dir")
				writeToken(t, def, "from-default-dir")
			},
			want: "Bearer from-data-dir",
		},
		{
			name: "default data dir file",
			vars: func(string) map[string]string { return nil },
			files: func(t *testing.T, def, _ string) {
				writeToken(t, def, "from-default-dir")
			},
			want: "Bearer from-default-dir",
		},
		{
			name:  "none",
			vars:  func(string) map[string]string { return nil },
			files: func(*testing.T, string, string) {},
			want:  "",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dataDir := t.TempDir()
			e := testEnv(t, tt.vars(dataDir))
			tt.files(t, e.dataDir, dataDir)
			var got string
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got = r.Header.Get("Authorization")
				writeJSON(w, http.StatusOK, api.NodeList{})
			})
			argv := []string{"nodes"}
			if tt.flag != "" {
				argv = append(argv, "--token", tt.flag)
			}
			if res := (invocation{env: e}).run(t, h, argv...); res.code != 0 {
				t.Fatalf("exit %d: %s", res.code, res.stderr)
			}
			if got != tt.want {
				t.Errorf("Authorization = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestURLFromEnv(t *testing.T) {
	var hit bool
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hit = true
		writeJSON(w, http.StatusOK, api.NodeList{})
	})
	srv := newServer(t, h)
	res := invocation{env: testEnv(t, map[string]string{"DSEC_URL": srv})}.run(t, nil, "nodes")
	if res.code != 0 || !hit {
		t.Errorf("DSEC_URL not used: %+v", res)
	}
}
