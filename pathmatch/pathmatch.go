// Package pathmatch matches layer paths (relative, slash-separated, the root
// is "") against glob patterns. It is the matching engine of the [[rule]]
// tables of a stack spec; layers (acl, snoop filters, per-file chains) call it
// through registry.Rules.
//
// Pattern grammar:
//
//	text     matches
//	*        any run of characters within one path element (not "/")
//	?        one character, not "/"
//	[abc]    one of the characters; [a-z] a range; [!a-z] or [^a-z] none of them
//	{a,b}    either alternative (alternatives may hold any pattern text; nesting is allowed)
//	**       as a whole element: zero or more path elements ("**/x", "a/**/b";
//	         "a/**" matches a and everything below it)
//	\c       the character c itself
//
// A pattern without a "/" (apart from a trailing one) matches the last
// elements of a path at any depth ("*.log" matches "x.log" and "a/b/x.log").
// A pattern with a "/" inside is anchored at the root of the layer; a leading
// "/" only anchors ("/x" matches "x" but not "a/x"). A trailing "/" matches
// the path and everything below it ("/cache/" matches "cache" and
// "cache/a/b"; "cache/" also matches "a/cache/b"). The empty pattern and "/"
// match only the root.
package pathmatch

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxAlternatives bounds how many patterns one pattern with braces expands
// to, so that a pattern such as {a,b}{a,b}{a,b}... cannot exhaust memory.
const MaxAlternatives = 256

// Error is a malformed pattern. Offset is the byte offset in the pattern of
// the mistake.
type Error struct {
	Pattern string
	Offset  int
	Msg     string
}

func (e *Error) Error() string {
	return fmt.Sprintf("bad pattern %q at column %d: %s", e.Pattern, e.Offset+1, e.Msg)
}

// Pattern is a compiled pattern.
type Pattern struct {
	src  string
	alts []alt // brace alternatives, each a full pattern without braces
}

type alt struct {
	anyDepth bool   // no "/": match the last element at any depth
	subtree  bool   // trailing "/": match the path and everything below it
	elems    []elem // one per path element
}

// elem is one path element of a pattern: "**" or a sequence of tokens.
type elem struct {
	deep bool // "**"
	toks []tok
}

type tokKind uint8

const (
	tLit   tokKind = iota // one literal rune
	tOne                  // ?
	tStar                 // *
	tClass                // [...]
)

type tok struct {
	kind   tokKind
	r      rune
	negate bool
	ranges []rune // pairs lo, hi
}

// Compile parses a pattern.
func Compile(pattern string) (*Pattern, error) {
	if !utf8.ValidString(pattern) {
		return nil, &Error{pattern, 0, "not valid UTF-8"}
	}
	srcs, err := expandBraces(pattern)
	if err != nil {
		return nil, err
	}
	p := &Pattern{src: pattern}
	for _, s := range srcs {
		a, err := compileAlt(pattern, s)
		if err != nil {
			return nil, err
		}
		p.alts = append(p.alts, a)
	}
	return p, nil
}

// MustCompile is Compile for patterns known to be good; it panics otherwise.
func MustCompile(pattern string) *Pattern {
	p, err := Compile(pattern)
	if err != nil {
		panic(err)
	}
	return p
}

// String returns the pattern as written.
func (p *Pattern) String() string { return p.src }

// piece is a run of pattern text with the offset in the original pattern of
// each byte, so that errors found after brace expansion point at the right
// column.
type piece struct {
	s   string
	off []int
}

func (a piece) cat(b piece) piece {
	off := make([]int, 0, len(a.off)+len(b.off))
	off = append(append(off, a.off...), b.off...)
	return piece{a.s + b.s, off}
}

// expandBraces turns "a{b,c}d" into "abd" and "acd".
func expandBraces(pattern string) ([]piece, error) {
	pos := 0
	var seq func(depth int) ([]piece, error)
	// seq parses until an unmatched "," or "}" (when depth > 0) or the end.
	seq = func(depth int) ([]piece, error) {
		out := []piece{{}}
		lit := func(from, to int) {
			off := make([]int, to-from)
			for i := range off {
				off[i] = from + i
			}
			pc := piece{pattern[from:to], off}
			for i := range out {
				out[i] = out[i].cat(pc)
			}
		}
		start := pos
		inClass := false
		for pos < len(pattern) {
			c := pattern[pos]
			switch {
			case c == '\\':
				pos += 2
				if pos > len(pattern) {
					return nil, &Error{pattern, len(pattern) - 1, "\\ at the end escapes nothing"}
				}
				continue
			case inClass:
				if c == ']' {
					inClass = false
				}
			case c == '[':
				inClass = true
				// "[]" and "[!]" start a class holding "]".
				if pos+1 < len(pattern) && (pattern[pos+1] == '!' || pattern[pos+1] == '^') {
					pos++
				}
				if pos+1 < len(pattern) && pattern[pos+1] == ']' {
					pos++
				}
			case c == '{':
				lit(start, pos)
				open := pos
				pos++
				var alts []piece
				for {
					sub, err := seq(depth + 1)
					if err != nil {
						return nil, err
					}
					alts = append(alts, sub...)
					if pos >= len(pattern) {
						return nil, &Error{pattern, open, "{ is not closed by }"}
					}
					if pattern[pos] == '}' {
						pos++
						break
					}
					pos++ // ','
				}
				if len(out)*len(alts) > MaxAlternatives {
					return nil, &Error{pattern, open, fmt.Sprintf("braces expand to more than %d patterns", MaxAlternatives)}
				}
				var next []piece
				for _, o := range out {
					for _, a := range alts {
						next = append(next, o.cat(a))
					}
				}
				out = next
				start = pos
				continue
			case c == ',' || c == '}':
				if depth > 0 {
					lit(start, pos)
					return out, nil
				}
				if c == '}' {
					return nil, &Error{pattern, pos, "} without {"}
				}
			}
			pos++
		}
		if inClass {
			return nil, &Error{pattern, len(pattern) - 1, "[ is not closed by ]"}
		}
		lit(start, len(pattern))
		return out, nil
	}
	return seq(0)
}

func compileAlt(orig string, pc piece) (alt, error) {
	s := pc.s
	errAt := func(i int, msg string) error {
		o := 0
		if i < len(pc.off) {
			o = pc.off[i]
		} else if len(pc.off) > 0 {
			o = pc.off[len(pc.off)-1]
		}
		return &Error{orig, o, msg}
	}
	var a alt
	base := 0
	if strings.HasPrefix(s, "/") {
		s, base = s[1:], 1
	} else if !strings.Contains(strings.TrimSuffix(s, "/"), "/") {
		a.anyDepth = true
	}
	if strings.HasSuffix(s, "/") {
		a.subtree = true
		s = s[:len(s)-1]
	}
	if s == "" {
		a.anyDepth = false // "", "/" or "//": the root (and with "//", everything)
		return a, nil
	}
	i := 0
	for _, part := range splitUnescaped(s) {
		at := base + i
		i += len(part) + 1
		if part == "" {
			return a, errAt(at, "empty path element (two slashes in a row)")
		}
		if part == "**" {
			a.elems = append(a.elems, elem{deep: true})
			continue
		}
		if j := strings.Index(part, "**"); j >= 0 && !escapedAt(part, j) {
			return a, errAt(at+j, "** must be a whole path element, as in a/**/b")
		}
		if part == "." || part == ".." {
			return a, errAt(at, fmt.Sprintf("%q is not allowed: paths are relative to the layer's root", part))
		}
		toks, off, err := compileElem(part)
		if err != nil {
			return a, errAt(at+off, err.Error())
		}
		a.elems = append(a.elems, elem{toks: toks})
	}
	if a.anyDepth && len(a.elems) == 1 && a.elems[0].deep {
		a.anyDepth = false // "**" alone: everything
	}
	return a, nil
}

func escapedAt(s string, i int) bool {
	n := 0
	for j := i - 1; j >= 0 && s[j] == '\\'; j-- {
		n++
	}
	return n%2 == 1
}

// splitUnescaped splits at "/" (a pattern cannot escape "/": it is never part
// of a name).
func splitUnescaped(s string) []string { return strings.Split(s, "/") }

func compileElem(s string) ([]tok, int, error) {
	var toks []tok
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch r {
		case '\\':
			if i+1 >= len(s) {
				return nil, i, fmt.Errorf("\\ at the end escapes nothing")
			}
			r2, n2 := utf8.DecodeRuneInString(s[i+1:])
			toks = append(toks, tok{kind: tLit, r: r2})
			i += 1 + n2
		case '?':
			toks = append(toks, tok{kind: tOne})
			i += n
		case '*':
			if len(toks) == 0 || toks[len(toks)-1].kind != tStar {
				toks = append(toks, tok{kind: tStar})
			}
			i += n
		case '[':
			t, m, err := compileClass(s[i:])
			if err != nil {
				return nil, i, err
			}
			toks = append(toks, t)
			i += m
		default:
			toks = append(toks, tok{kind: tLit, r: r})
			i += n
		}
	}
	return toks, 0, nil
}

// compileClass parses "[...]" at the start of s and returns its length.
func compileClass(s string) (tok, int, error) {
	t := tok{kind: tClass}
	i := 1
	if i < len(s) && (s[i] == '!' || s[i] == '^') {
		t.negate = true
		i++
	}
	first := true
	for {
		if i >= len(s) {
			return t, 0, fmt.Errorf("[ is not closed by ]")
		}
		if s[i] == ']' && !first {
			return t, i + 1, nil
		}
		first = false
		lo, n, err := classRune(s, i)
		if err != nil {
			return t, 0, err
		}
		i += n
		hi := lo
		if i+1 < len(s) && s[i] == '-' && s[i+1] != ']' {
			hi, n, err = classRune(s, i+1)
			if err != nil {
				return t, 0, err
			}
			if hi < lo {
				return t, 0, fmt.Errorf("range %c-%c is backwards", lo, hi)
			}
			i += 1 + n
		}
		t.ranges = append(t.ranges, lo, hi)
	}
}

func classRune(s string, i int) (rune, int, error) {
	if s[i] == '\\' {
		if i+1 >= len(s) {
			return 0, 0, fmt.Errorf("[ is not closed by ]")
		}
		r, n := utf8.DecodeRuneInString(s[i+1:])
		return r, 1 + n, nil
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return r, n, nil
}

// Match reports whether path (relative, slash-separated, "" for the root)
// matches the pattern.
func (p *Pattern) Match(path string) bool {
	path = strings.Trim(path, "/")
	var names []string
	if path != "" {
		names = strings.Split(path, "/")
	}
	for i := range p.alts {
		if p.alts[i].match(names) {
			return true
		}
	}
	return false
}

func (a *alt) match(names []string) bool {
	if a.anyDepth {
		// The pattern's elements match the last elements of the path (or,
		// with a trailing "/", of any ancestor).
		for end := len(names); end >= len(a.elems); end-- {
			if matchElems(a.elems, names[end-len(a.elems):end]) {
				return true
			}
			if !a.subtree {
				break
			}
		}
		return false
	}
	if a.subtree {
		for end := len(names); end >= 0; end-- {
			if matchElems(a.elems, names[:end]) {
				return true
			}
		}
		return false
	}
	return matchElems(a.elems, names)
}

// matchElems matches pattern elements against path elements; "**" takes
// zero or more. It runs in O(len(pat) * len(names)) thanks to the memo.
func matchElems(pat []elem, names []string) bool {
	memo := make([]int8, (len(pat)+1)*(len(names)+1)) // 0 unknown, 1 yes, 2 no
	var m func(i, j int) bool
	m = func(i, j int) bool {
		k := i*(len(names)+1) + j
		if memo[k] != 0 {
			return memo[k] == 1
		}
		var ok bool
		switch {
		case i == len(pat):
			ok = j == len(names)
		case pat[i].deep:
			ok = m(i+1, j) || (j < len(names) && m(i, j+1))
		default:
			ok = j < len(names) && matchName(pat[i].toks, names[j]) && m(i+1, j+1)
		}
		if ok {
			memo[k] = 1
		} else {
			memo[k] = 2
		}
		return ok
	}
	return m(0, 0)
}

// matchName matches one path element, backtracking to the last "*" only
// (linear in practice, O(len(toks)*len(name)) at worst).
func matchName(toks []tok, name string) bool {
	ti, ni := 0, 0
	starT, starN := -1, 0
	for ni < len(name) || ti < len(toks) {
		if ti < len(toks) {
			t := toks[ti]
			if t.kind == tStar {
				starT, starN = ti, ni
				ti++
				continue
			}
			if ni < len(name) {
				r, n := utf8.DecodeRuneInString(name[ni:])
				if t.matches(r) {
					ti++
					ni += n
					continue
				}
			}
		}
		if starT >= 0 && starN < len(name) {
			_, n := utf8.DecodeRuneInString(name[starN:])
			starN += n
			ti, ni = starT+1, starN
			continue
		}
		return false
	}
	return true
}

func (t tok) matches(r rune) bool {
	switch t.kind {
	case tLit:
		return r == t.r
	case tOne:
		return r != '/'
	case tClass:
		in := false
		for i := 0; i+1 < len(t.ranges); i += 2 {
			if t.ranges[i] <= r && r <= t.ranges[i+1] {
				in = true
				break
			}
		}
		return in != t.negate && r != '/'
	}
	return false
}

// Set is a list of patterns with exceptions: a path is in the set when it
// matches one of Match and none of Except.
type Set struct {
	Match  []*Pattern
	Except []*Pattern
}

// NewSet compiles a set; the error names the first bad pattern.
func NewSet(match, except []string) (*Set, error) {
	s := &Set{}
	for _, m := range match {
		p, err := Compile(m)
		if err != nil {
			return nil, err
		}
		s.Match = append(s.Match, p)
	}
	for _, m := range except {
		p, err := Compile(m)
		if err != nil {
			return nil, err
		}
		s.Except = append(s.Except, p)
	}
	return s, nil
}

// Contains reports whether path is in the set.
func (s *Set) Contains(path string) bool {
	if s == nil {
		return false
	}
	in := false
	for _, p := range s.Match {
		if p.Match(path) {
			in = true
			break
		}
	}
	if !in {
		return false
	}
	for _, p := range s.Except {
		if p.Match(path) {
			return false
		}
	}
	return true
}
