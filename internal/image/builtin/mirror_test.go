package builtin

import (
	"os"
	"path/filepath"
	"testing"
)

func TestAptMirror(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string // under etc/apt
		want  string
	}{
		{name: "no apt", want: defaultMirror},
		{
			name:  "one-line",
			files: map[string]string{"sources.list": "# comment\ndeb-src http://src.example/debian bookworm main\ndeb http://mirror.example/debian/ bookworm main contrib # trailing\n"},
			want:  "http://mirror.example/debian",
		},
		{
			name:  "one-line options",
			files: map[string]string{"sources.list": "deb [ arch=amd64 signed-by=/k.gpg ] https://m.example/debian bookworm main\n"},
			want:  "https://m.example/debian",
		},
		{
			name: "skips other suites, components and schemes",
			files: map[string]string{"sources.list": "deb http://sec.example/debian-security bookworm-security main\n" +
				"deb http://m.example/debian bookworm contrib\n" +
				"deb file:///srv/debian bookworm main\n" +
				"deb http://m.example/debian trixie main\n"},
			want: defaultMirror,
		},
		{
			name: "deb822 as on Debian 12",
			files: map[string]string{"sources.list.d/debian.sources": "Types: deb\n# http://snapshot.example/archive\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n" +
				"Types: deb\nURIs: http://deb.example/debian-security\nSuites: bookworm-security\nComponents: main\n"},
			want: "http://deb.example/debian",
		},
		{
			name: "deb822 disabled and multi-line",
			files: map[string]string{"sources.list.d/a.sources": "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n" +
				"types: deb deb-src\nuris: ftp://ftp.example/debian\n http://on.example/debian\nsuites: bookworm\ncomponents: main\n"},
			want: "http://on.example/debian",
		},
		{
			name: "sources.list first, then sources.list.d in name order",
			files: map[string]string{
				"sources.list.d/b.list":    "deb http://b.example/debian bookworm main\n",
				"sources.list.d/a.sources": "Types: deb\nURIs: http://a.example/debian\nSuites: bookworm\nComponents: main\n",
				"sources.list.d/0.ignored": "deb http://ignored.example/debian bookworm main\n",
			},
			want: "http://a.example/debian",
		},
		{
			name: "empty sources.list",
			files: map[string]string{
				"sources.list":          "",
				"sources.list.d/z.list": "deb http://z.example/debian bookworm main\n",
			},
			want: "http://z.example/debian",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range tc.files {
				p := filepath.Join(root, "etc/apt", name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := aptMirror(root); got != tc.want {
				t.Errorf("aptMirror = %q, want %q", got, tc.want)
			}
		})
	}
	t.Logf("this host's mirror: %s", aptMirror("/"))
}
