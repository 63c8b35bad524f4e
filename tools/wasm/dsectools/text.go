package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// echo prints its arguments separated by spaces and a newline (-n: none).
func echo(args []string) int {
	nl := true
	if len(args) > 0 && args[0] == "-n" {
		nl, args = false, args[1:]
	}
	s := strings.Join(args, " ")
	if nl {
		s += "\n"
	}
	if _, err := io.WriteString(os.Stdout, s); err != nil {
		return 1
	}
	return 0
}

// inputs calls fn for stdin (no names, or "-") or each named file, and
// returns 1 if any could not be opened.
func inputs(name string, files []string, fn func(label string, r io.Reader) error) int {
	if len(files) == 0 {
		files = []string{"-"}
	}
	code := 0
	for _, f := range files {
		if f == "-" {
			if err := fn("-", os.Stdin); err != nil {
				code = fail(name, 1, "%v", err)
			}
			continue
		}
		fh, err := os.Open(f)
		if err != nil {
			code = fail(name, 1, "%v", err)
			continue
		}
		err = fn(f, fh)
		fh.Close()
		if err != nil {
			code = fail(name, 1, "%s: %v", f, err)
		}
	}
	return code
}

// cat copies stdin or its file arguments to stdout.
func cat(args []string) int {
	return inputs("cat", args, func(_ string, r io.Reader) error {
		_, err := io.Copy(os.Stdout, r)
		return err
	})
}

type counts struct{ lines, words, bytes int64 }

func count(r io.Reader) (counts, error) {
	var c counts
	br := bufio.NewReaderSize(r, 64<<10)
	inWord := false
	for {
		b, err := br.ReadByte()
		if err == io.EOF {
			return c, nil
		}
		if err != nil {
			return c, err
		}
		c.bytes++
		if b == '\n' {
			c.lines++
		}
		if b < utf8.RuneSelf && unicode.IsSpace(rune(b)) {
			inWord = false
		} else if !inWord {
			inWord = true
			c.words++
		}
	}
}

// wc counts lines, words and bytes like coreutils wc (-l, -w, -c select).
func wc(args []string) int {
	var showL, showW, showC bool
	var files []string
	for _, a := range args {
		switch {
		case a == "-" || !strings.HasPrefix(a, "-"):
			files = append(files, a)
		default:
			for _, f := range a[1:] {
				switch f {
				case 'l':
					showL = true
				case 'w':
					showW = true
				case 'c':
					showC = true
				default:
					return fail("wc", 2, "unknown option -%c", f)
				}
			}
		}
	}
	if !showL && !showW && !showC {
		showL, showW, showC = true, true, true
	}
	type row struct {
		c     counts
		label string
	}
	var rows []row
	var total counts
	code := inputs("wc", files, func(label string, r io.Reader) error {
		c, err := count(r)
		if err != nil {
			return err
		}
		total.lines += c.lines
		total.words += c.words
		total.bytes += c.bytes
		if len(files) == 0 {
			label = ""
		}
		rows = append(rows, row{c, label})
		return nil
	})
	if len(rows) > 1 {
		rows = append(rows, row{total, "total"})
	}
	nshow := 0
	for _, b := range []bool{showL, showW, showC} {
		if b {
			nshow++
		}
	}
	// coreutils: one number for one input needs no padding; standard
	// input gets width 7; files get the width of the total byte count.
	width := len(fmt.Sprint(total.bytes))
	switch {
	case nshow == 1 && len(rows) == 1:
		width = 1
	case len(files) == 0 || contains(files, "-"):
		width = 7
	}
	w := bufio.NewWriter(os.Stdout)
	for _, r := range rows {
		var parts []string
		if showL {
			parts = append(parts, fmt.Sprintf("%*d", width, r.c.lines))
		}
		if showW {
			parts = append(parts, fmt.Sprintf("%*d", width, r.c.words))
		}
		if showC {
			parts = append(parts, fmt.Sprintf("%*d", width, r.c.bytes))
		}
		if r.label != "" {
			parts = append(parts, r.label)
		}
		fmt.Fprintln(w, strings.Join(parts, " "))
	}
	w.Flush()
	return code
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// env prints the environment sorted, NAME=value per line.
func env(args []string) int {
	vars := os.Environ()
	sort.Strings(vars)
	w := bufio.NewWriter(os.Stdout)
	for _, v := range vars {
		fmt.Fprintln(w, v)
	}
	if err := w.Flush(); err != nil {
		return 1
	}
	return 0
}

// yes repeats its argument (default "y") on stdout until writing fails.
func yes(args []string) int {
	line := "y"
	if len(args) > 0 {
		line = strings.Join(args, " ")
	}
	line += "\n"
	buf := []byte(strings.Repeat(line, max(1, 32<<10/len(line))))
	for {
		if _, err := os.Stdout.Write(buf); err != nil {
			return 1
		}
	}
}

// ls lists directories (default the working directory), one name per line;
// directories get a trailing slash. -l adds mode and size.
func ls(args []string) int {
	long := false
	var dirs []string
	for _, a := range args {
		if a == "-l" {
			long = true
			continue
		}
		dirs = append(dirs, a)
	}
	if len(dirs) == 0 {
		dirs = []string{"."}
	}
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	code := 0
	for i, d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			if fi, serr := os.Stat(d); serr == nil && !fi.IsDir() {
				printEntry(w, d, fi, long)
				continue
			}
			code = fail("ls", 1, "%v", err)
			continue
		}
		if len(dirs) > 1 {
			if i > 0 {
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "%s:\n", d)
		}
		for _, e := range entries {
			fi, err := e.Info()
			if err != nil {
				code = fail("ls", 1, "%v", err)
				continue
			}
			printEntry(w, e.Name(), fi, long)
		}
	}
	return code
}

func printEntry(w io.Writer, name string, fi os.FileInfo, long bool) {
	if fi.IsDir() {
		name += "/"
	}
	if long {
		fmt.Fprintf(w, "%s %10d %s\n", fi.Mode(), fi.Size(), name)
		return
	}
	fmt.Fprintln(w, name)
}

// write copies stdin to the file named by its argument (-a: append).
func write(args []string) int {
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if len(args) > 0 && args[0] == "-a" {
		flags, args = os.O_WRONLY|os.O_CREATE|os.O_APPEND, args[1:]
	}
	if len(args) != 1 {
		return fail("write", 2, "usage: write [-a] FILE < input")
	}
	f, err := os.OpenFile(args[0], flags, 0o644)
	if err != nil {
		return fail("write", 1, "%v", err)
	}
	if _, err := io.Copy(f, os.Stdin); err != nil {
		f.Close()
		return fail("write", 1, "%s: %v", args[0], err)
	}
	if err := f.Close(); err != nil {
		return fail("write", 1, "%s: %v", args[0], err)
	}
	return 0
}

// sha256sum prints "<hex>  <name>" for stdin ("-") or each file.
func sha256sum(args []string) int {
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	return inputs("sha256sum", args, func(label string, r io.Reader) error {
		h := sha256.New()
		if _, err := io.Copy(h, r); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s  %s\n", hex.EncodeToString(h.Sum(nil)), label)
		return nil
	})
}
