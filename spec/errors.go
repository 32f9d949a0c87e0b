package spec

import (
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// Pos is a position in a spec: file, line and column (both from 1; the
// column counts bytes). For the inline form the file is "inline" and the line
// is 1.
type Pos struct {
	File      string
	Line, Col int
}

func (p Pos) String() string {
	if p.Line == 0 {
		return p.File
	}
	return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col)
}

// Error is one mistake in a spec, at a position.
type Error struct {
	Pos Pos
	Msg string
	// Err is the error of a layer's constructor, when that is the cause
	// (errors.Is and As reach it).
	Err error
	// Line is the text of the line the position is in ("" when the error is
	// about the whole spec); see Detail.
	Line string
}

func (e *Error) Error() string { return e.Pos.String() + ": " + e.Msg }
func (e *Error) Unwrap() error { return e.Err }

// Detail is the error followed by its line of the spec and a caret under the
// column, as `cairn check` prints it.
func (e *Error) Detail() string {
	if e.Line == "" || e.Pos.Col < 1 {
		return e.Error()
	}
	line := strings.TrimRight(e.Line, "\r")
	col := e.Pos.Col - 1
	if col > len(line) {
		col = len(line)
	}
	line, col = clip(line, col)
	var pad strings.Builder
	for _, c := range []byte(line[:col]) {
		if c == '\t' {
			pad.WriteByte('\t')
		} else if c < 0x80 || c >= 0xc0 {
			pad.WriteByte(' ') // one space per character, not per byte
		}
	}
	return fmt.Sprintf("%s\n    %s\n    %s^", e.Error(), line, pad.String())
}

// maxShown is how many bytes of a long line Detail shows around the column.
const maxShown = 100

// clip cuts a long line (an inline spec of many layers) to about maxShown
// bytes around col, marking the cuts with "...", and returns the column in
// what is left.
func clip(line string, col int) (string, int) {
	if len(line) <= maxShown {
		return line, col
	}
	start := max(col-maxShown/2, 0)
	end := min(start+maxShown, len(line))
	for start > 0 && !utf8.RuneStart(line[start]) {
		start--
	}
	for end < len(line) && !utf8.RuneStart(line[end]) {
		end++
	}
	out, col := line[start:end], col-start
	if start > 0 {
		out, col = "..."+out, col+3
	}
	if end < len(line) {
		out += "..."
	}
	return out, col
}

// Detail prints every error with its line and caret (see Error.Detail), or
// err itself when it is not a spec error.
func Detail(err error) string {
	switch x := err.(type) {
	case ErrorList:
		var b strings.Builder
		for i, e := range x {
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(e.Detail())
		}
		return b.String()
	case *Error:
		return x.Detail()
	}
	return err.Error()
}

// Count is the number of errors in err (1 for an error that is not a list).
func Count(err error) int {
	if l, ok := err.(ErrorList); ok {
		return len(l)
	}
	if err == nil {
		return 0
	}
	return 1
}

// fillLines sets each error's Line from the spec's text.
func (l ErrorList) fillLines(file string, data []byte) {
	var lines []string
	for _, e := range l {
		if e.Pos.File != file || e.Pos.Line < 1 {
			continue
		}
		if lines == nil {
			lines = strings.Split(string(data), "\n")
		}
		if e.Pos.Line <= len(lines) {
			e.Line = lines[e.Pos.Line-1]
		}
	}
}

// ErrorList is every mistake found in a spec, in the order of the file. Its
// Error prints one per line.
type ErrorList []*Error

func (l ErrorList) Error() string {
	var b strings.Builder
	for i, e := range l {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap lets errors.As find each *Error.
func (l ErrorList) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

func (l ErrorList) sort() {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i].Pos, l[j].Pos
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
}

// err returns nil for an empty list (a nil ErrorList in an error interface
// would not be nil).
func (l ErrorList) err() error {
	if len(l) == 0 {
		return nil
	}
	l.sort()
	return l
}

// didYouMean returns `; did you mean "x"?` when one of known is close to
// got, else "".
func didYouMean(got string, known []string) string {
	best, bestD := "", 1<<30
	for _, k := range known {
		d := distance(strings.ToLower(got), strings.ToLower(k))
		if d < bestD {
			best, bestD = k, d
		}
	}
	limit := 2
	if len(got) <= 3 {
		limit = 1
	}
	if best == "" || bestD > limit || best == got {
		return ""
	}
	return fmt.Sprintf("; did you mean %q?", best)
}

// distance is the Damerau-Levenshtein (optimal string alignment) distance,
// in runes.
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	if len(ra) > 64 || len(rb) > 64 {
		if a == b {
			return 0
		}
		return 1 << 20
	}
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// quoteList formats names as "a", "b" and "c".
func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return andList(q)
}

func andList(q []string) string {
	switch len(q) {
	case 0:
		return "none"
	case 1:
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " and " + q[len(q)-1]
}

func orList(q []string) string {
	switch len(q) {
	case 0:
		return "none"
	case 1:
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

// finish sorts the errors and notes when some were left out.
func (l ErrorList) finish(file string) error {
	if len(l) == 0 {
		return nil
	}
	l.sort()
	if len(l) >= maxErrors {
		l = append(l, &Error{Pos: Pos{File: file}, Msg: fmt.Sprintf("too many errors: stopped after %d", maxErrors)})
	}
	return l
}

// DidYouMean returns `; did you mean "x"?` when one of known is close to
// got (a misspelt command, option or operation name), else "".
func DidYouMean(got string, known []string) string { return didYouMean(got, known) }
