package sandbox

import (
	"strings"

	"github.com/dsec-dev/dsec/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Argv returns the argv a request runs on a tier with capabilities caps.
func Argv(tier string, caps Capabilities, req *ExecRequest) ([]string, error) {
	switch {
	case len(req.Cmd) > 0 && req.Command != "":
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "set cmd or command, not both")
	case len(req.Cmd) > 0:
		if req.Cmd[0] == "" {
			return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "cmd[0] is empty")
		}
		return req.Cmd, nil
	case strings.TrimSpace(req.Command) == "":
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "no command given: set cmd or command")
	case caps.Shell:
		return []string{"/bin/sh", "-c", req.Command}, nil
	}
	argv, err := SplitCommand(req.Command)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unsupported, api.CodeNoShell, err,
			"the %s tier has no shell: pass argv in cmd, or a command line without shell syntax", tier)
	}
	return argv, nil
}

// SplitCommand splits a command line into words the way a POSIX shell
// would for the plain cases: blanks separate words, single quotes keep text
// literally, double quotes keep text with \" \\ \$ \` escapes, a backslash
// escapes the next character. Shell syntax that needs a shell (pipes,
// redirection, variables, substitution, globbing, command lists) is an
// error rather than a silent surprise.
func SplitCommand(s string) ([]string, error) {
	var (
		words  []string
		cur    strings.Builder
		inWord bool
	)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\\':
			if i+1 >= len(s) {
				return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "command ends with a backslash")
			}
			i++
			cur.WriteByte(s[i])
			inWord = true
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '$' || s[i] == '`' {
					return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "%q needs a shell", s[i])
				}
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`", s[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "unterminated double quote")
			}
			inWord = true
		case strings.IndexByte("|&;<>()$`*?[#~\n", c) >= 0 && !(c == '#' && inWord) && !(c == '~' && inWord):
			return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "%q needs a shell", c)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	if len(words) == 0 {
		return nil, errdefs.New(errdefs.Invalid, api.CodeInvalidCommand, "command is empty")
	}
	return words, nil
}
