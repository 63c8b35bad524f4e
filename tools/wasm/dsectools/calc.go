package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// calc evaluates an arithmetic expression given as arguments or on stdin:
// + - * / % ^ (power, right-associative), parentheses, unary minus and
// floating-point numbers. Errors exit 2.
func calc(args []string) int {
	src := strings.Join(args, " ")
	if len(args) == 0 {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return fail("calc", 2, "%v", err)
		}
		src = string(b)
	}
	v, err := evaluate(src)
	if err != nil {
		return fail("calc", 2, "%v", err)
	}
	fmt.Println(formatNumber(v))
	return 0
}

func formatNumber(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// evaluate parses and evaluates an expression.
func evaluate(src string) (float64, error) {
	p := &parser{src: src}
	p.next()
	if p.tok == "" {
		return 0, errors.New("empty expression")
	}
	v, err := p.expr()
	if err != nil {
		return 0, err
	}
	if p.tok != "" {
		return 0, fmt.Errorf("unexpected %q at offset %d", p.tok, p.start)
	}
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, errors.New("result is not a finite number")
	}
	return v, nil
}

// parser is a recursive-descent parser over a one-token lookahead:
//
//	expr  = term { ("+" | "-") term }
//	term  = unary { ("*" | "/" | "%") unary }
//	unary = ("-" | "+") unary | power
//	power = primary [ "^" unary ]
type parser struct {
	src        string
	pos, start int
	tok        string // "" at the end
	depth      int
}

func (p *parser) next() {
	for p.pos < len(p.src) && strings.IndexByte(" \t\r\n", p.src[p.pos]) >= 0 {
		p.pos++
	}
	p.start = p.pos
	if p.pos >= len(p.src) {
		p.tok = ""
		return
	}
	c := p.src[p.pos]
	if c >= '0' && c <= '9' || c == '.' {
		end := p.pos
		for end < len(p.src) && (p.src[end] >= '0' && p.src[end] <= '9' || p.src[end] == '.') {
			end++
		}
		// An exponent: 1e3, 2.5E-2.
		if end < len(p.src) && (p.src[end] == 'e' || p.src[end] == 'E') {
			e := end + 1
			if e < len(p.src) && (p.src[e] == '+' || p.src[e] == '-') {
				e++
			}
			if e < len(p.src) && p.src[e] >= '0' && p.src[e] <= '9' {
				for e < len(p.src) && p.src[e] >= '0' && p.src[e] <= '9' {
					e++
				}
				end = e
			}
		}
		p.tok, p.pos = p.src[p.pos:end], end
		return
	}
	p.tok, p.pos = p.src[p.pos:p.pos+1], p.pos+1
}

func (p *parser) expr() (float64, error) {
	v, err := p.term()
	for err == nil && (p.tok == "+" || p.tok == "-") {
		op := p.tok
		p.next()
		var r float64
		if r, err = p.term(); err == nil {
			if op == "+" {
				v += r
			} else {
				v -= r
			}
		}
	}
	return v, err
}

func (p *parser) term() (float64, error) {
	v, err := p.unary()
	for err == nil && (p.tok == "*" || p.tok == "/" || p.tok == "%") {
		op := p.tok
		p.next()
		var r float64
		if r, err = p.unary(); err != nil {
			break
		}
		switch {
		case op == "*":
			v *= r
		case r == 0:
			return 0, errors.New("division by zero")
		case op == "/":
			v /= r
		default:
			v = math.Mod(v, r)
		}
	}
	return v, err
}

func (p *parser) unary() (float64, error) {
	if p.depth++; p.depth > 1000 {
		return 0, errors.New("expression nests too deeply")
	}
	defer func() { p.depth-- }()
	switch p.tok {
	case "-":
		p.next()
		v, err := p.unary()
		return -v, err
	case "+":
		p.next()
		return p.unary()
	}
	return p.power()
}

func (p *parser) power() (float64, error) {
	base, err := p.primary()
	if err != nil || p.tok != "^" {
		return base, err
	}
	p.next()
	exp, err := p.unary()
	return math.Pow(base, exp), err
}

func (p *parser) primary() (float64, error) {
	switch tok := p.tok; {
	case tok == "":
		return 0, errors.New("unexpected end of expression")
	case tok == "(":
		p.next()
		v, err := p.expr()
		if err != nil {
			return 0, err
		}
		if p.tok != ")" {
			return 0, fmt.Errorf("missing ) at offset %d", p.start)
		}
		p.next()
		return v, nil
	case tok[0] >= '0' && tok[0] <= '9' || tok[0] == '.':
		v, err := strconv.ParseFloat(tok, 64)
		if err != nil {
			return 0, fmt.Errorf("bad number %q", tok)
		}
		p.next()
		return v, nil
	default:
		return 0, fmt.Errorf("unexpected %q at offset %d", tok, p.start)
	}
}
