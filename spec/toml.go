package spec

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/pelletier/go-toml/v2/unstable"
)

// This file turns TOML text into a tree of values that remember where they
// were written. The go-toml "unstable" parser gives the byte range of every
// key and value; it does not apply TOML's table rules, so this file does
// (duplicate keys, tables defined twice, values used as tables).

type vkind uint8

const (
	vString vkind = iota
	vInt
	vFloat
	vBool
	vDate
	vArray
	vTable
)

func (k vkind) String() string {
	return [...]string{"a string", "an integer", "a number", "a boolean", "a date", "a list", "a table"}[k]
}

// value is a TOML value with its position and that of its key.
type value struct {
	kind   vkind
	pos    Pos // where the value is written
	keyPos Pos // where its key is written
	s      string
	i      int64
	f      float64
	b      bool
	arr    []*value
	tab    *table
	aot    bool // an array of tables ([[x]])
	raw    string
}

// describe says what a value is, for "found ..." in errors.
func (v *value) describe() string {
	switch v.kind {
	case vString:
		return fmt.Sprintf("the string %q", v.s)
	case vInt:
		return fmt.Sprintf("the integer %d", v.i)
	case vFloat:
		return "the number " + v.raw
	case vBool:
		return fmt.Sprintf("the boolean %v", v.b)
	case vDate:
		return "the date " + v.raw
	case vArray:
		if v.aot {
			return "an array of tables"
		}
		return "a list"
	}
	return "a table"
}

// plain converts a value to the Go form registry.Option.Convert takes.
func (v *value) plain() any {
	switch v.kind {
	case vString:
		return v.s
	case vInt:
		return v.i
	case vFloat:
		return v.f
	case vBool:
		return v.b
	case vDate:
		return v.raw
	case vArray:
		out := make([]any, len(v.arr))
		for i, e := range v.arr {
			out[i] = e.plain()
		}
		return out
	}
	m := map[string]any{}
	for _, k := range v.tab.order {
		m[k] = v.tab.keys[k].plain()
	}
	return m
}

type table struct {
	keys     map[string]*value
	order    []string
	pos      Pos
	explicit bool // defined by a [header]
	dotted   bool // created by a dotted key
	inline   bool // an inline table: closed
}

func newTable(pos Pos) *table { return &table{keys: map[string]*value{}, pos: pos} }

func (t *table) set(k string, v *value) {
	t.keys[k] = v
	t.order = append(t.order, k)
}

// source maps byte offsets of a file to positions.
type source struct {
	file  string
	data  []byte
	lines []int // offset of the start of each line
}

func newSource(file string, data []byte) *source {
	s := &source{file: file, data: data, lines: []int{0}}
	for i, c := range data {
		if c == '\n' {
			s.lines = append(s.lines, i+1)
		}
	}
	return s
}

func (s *source) pos(off int) Pos {
	lo, hi := 0, len(s.lines)-1
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if s.lines[mid] <= off {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return Pos{File: s.file, Line: lo + 1, Col: off - s.lines[lo] + 1}
}

// maxErrors bounds how many errors one spec reports.
const maxErrors = 50

// parseTOML parses data into a root table. Syntax errors are collected: after
// one, parsing resumes at the next line, so that several are reported at once.
func parseTOML(src *source, errs *ErrorList) *table {
	root := newTable(Pos{File: src.file, Line: 1, Col: 1})
	root.explicit = true
	d := &decoder{src: src, errs: errs, root: root, cur: root}
	base := 0
	for base < len(src.data) && len(*errs) < maxErrors {
		var p unstable.Parser
		chunk := src.data[base:]
		p.Reset(chunk)
		d.p, d.base = &p, base
		ok := func() (ok bool) {
			defer func() {
				// The parser is not ours: never let it take the command down.
				if r := recover(); r != nil {
					d.errorf(src.pos(base), "cannot parse the spec here (%v)", r)
					ok = false
				}
			}()
			for p.NextExpression() {
				d.expr(p.Expression())
			}
			return true
		}()
		err := p.Error()
		if err == nil && ok {
			break
		}
		off := base
		if err != nil {
			var pe *unstable.ParserError
			if errors.As(err, &pe) {
				off = base + d.offset(pe.Highlight)
				d.errorf(src.pos(off), "%s", syntaxMessage(pe.Message))
			} else {
				d.errorf(src.pos(base), "%v", err)
			}
		}
		// Resume on the line after the error.
		nl := bytes.IndexByte(src.data[off:], '\n')
		if nl < 0 {
			break
		}
		base = off + nl + 1
		ls := bytes.LastIndexByte(src.data[:off], '\n') + 1
		if line := bytes.TrimLeft(src.data[ls:min(off+1, len(src.data))], " \t"); len(line) > 0 && line[0] == '[' {
			d.cur = nil // a broken header: its key/values belong nowhere
		}
	}
	return root
}

func syntaxMessage(m string) string {
	if strings.Contains(m, "at start of value") {
		m += " (a string needs quotes, as in path = \"/srv/data\")"
	}
	return "TOML syntax: " + m
}

type decoder struct {
	src  *source
	errs *ErrorList
	root *table
	cur  *table // the table key/values go to; nil after a broken header
	p    *unstable.Parser
	base int
}

func (d *decoder) errorf(p Pos, f string, a ...any) {
	if len(*d.errs) < maxErrors {
		*d.errs = append(*d.errs, &Error{Pos: p, Msg: fmt.Sprintf(f, a...)})
	}
}

// offset returns the offset in the current chunk of b, a slice of it.
func (d *decoder) offset(b []byte) int {
	data := d.p.Data()
	off := cap(data) - cap(b)
	if off < 0 || off > len(data) {
		return 0
	}
	return off
}

func (d *decoder) nodePos(n *unstable.Node) Pos {
	return d.src.pos(d.base + int(n.Raw.Offset))
}

type keyPart struct {
	name string
	pos  Pos
}

func (d *decoder) key(it unstable.Iterator) []keyPart {
	var out []keyPart
	for it.Next() {
		n := it.Node()
		out = append(out, keyPart{string(n.Data), d.nodePos(n)})
	}
	return out
}

func dotted(parts []keyPart) string {
	s := make([]string, len(parts))
	for i, p := range parts {
		s[i] = p.name
	}
	return strings.Join(s, ".")
}

func (d *decoder) expr(n *unstable.Node) {
	switch n.Kind {
	case unstable.Table:
		d.cur = d.header(d.key(n.Key()), false)
	case unstable.ArrayTable:
		d.cur = d.header(d.key(n.Key()), true)
	case unstable.KeyValue:
		if d.cur == nil {
			return
		}
		d.keyValue(d.cur, n)
	}
}

// walk descends to the table named by parts, creating implicit tables. It
// returns nil after reporting an error.
func (d *decoder) walk(t *table, parts []keyPart, create func(Pos) *table) *table {
	for i, k := range parts {
		v, ok := t.keys[k.name]
		if !ok {
			nt := create(k.pos)
			t.set(k.name, &value{kind: vTable, tab: nt, pos: k.pos, keyPos: k.pos})
			t = nt
			continue
		}
		switch {
		case v.kind == vTable:
			if v.tab.inline {
				d.errorf(k.pos, "%s was defined as an inline table at line %d; an inline table cannot be extended", dotted(parts[:i+1]), v.pos.Line)
				return nil
			}
			t = v.tab
		case v.kind == vArray && v.aot:
			t = v.arr[len(v.arr)-1].tab
		default:
			d.errorf(k.pos, "%s is already %s (line %d), so it cannot also be a table", dotted(parts[:i+1]), v.describe(), v.keyPos.Line)
			return nil
		}
	}
	return t
}

func (d *decoder) header(parts []keyPart, array bool) *table {
	if len(parts) == 0 {
		return nil
	}
	parent := d.walk(d.root, parts[:len(parts)-1], newTable)
	if parent == nil {
		return nil
	}
	last := parts[len(parts)-1]
	name := dotted(parts)
	v, ok := parent.keys[last.name]
	if array {
		nt := newTable(last.pos)
		nt.explicit = true
		elem := &value{kind: vTable, tab: nt, pos: last.pos, keyPos: last.pos}
		if !ok {
			parent.set(last.name, &value{kind: vArray, aot: true, arr: []*value{elem}, pos: last.pos, keyPos: last.pos})
			return nt
		}
		if v.kind == vArray && v.aot {
			v.arr = append(v.arr, elem)
			return nt
		}
		d.errorf(last.pos, "[[%s]] is already %s (line %d); it cannot also be an array of tables", name, v.describe(), v.keyPos.Line)
		return nil
	}
	if !ok {
		nt := newTable(last.pos)
		nt.explicit = true
		parent.set(last.name, &value{kind: vTable, tab: nt, pos: last.pos, keyPos: last.pos})
		return nt
	}
	switch {
	case v.kind == vTable && !v.tab.explicit && !v.tab.inline && !v.tab.dotted:
		v.tab.explicit = true
		v.tab.pos = last.pos
		v.keyPos = last.pos
		return v.tab
	case v.kind == vTable:
		d.errorf(last.pos, "duplicate table [%s]: it is already defined at line %d", name, v.keyPos.Line)
	default:
		d.errorf(last.pos, "[%s] is already %s (line %d); it cannot also be a table", name, v.describe(), v.keyPos.Line)
	}
	return nil
}

func (d *decoder) keyValue(t *table, n *unstable.Node) {
	parts := d.key(n.Key())
	if len(parts) == 0 {
		return
	}
	parent := d.walk(t, parts[:len(parts)-1], func(p Pos) *table {
		nt := newTable(p)
		nt.dotted = true
		return nt
	})
	if parent == nil {
		return
	}
	last := parts[len(parts)-1]
	v := d.value(n.Value(), n)
	if v == nil {
		return
	}
	v.keyPos = last.pos
	if old, dup := parent.keys[last.name]; dup {
		d.errorf(last.pos, "duplicate key %q: it is already set at line %d", dotted(parts), old.keyPos.Line)
		return
	}
	parent.set(last.name, v)
}

// value converts a value node. kv is the key/value node it belongs to, for
// the position of arrays (whose nodes carry no position).
func (d *decoder) value(n *unstable.Node, kv *unstable.Node) *value {
	v := &value{}
	switch n.Kind {
	case unstable.Array, unstable.InlineTable:
		v.pos = d.containerPos(n, kv)
	default:
		v.pos = d.nodePos(n)
		v.raw = string(n.Data)
	}
	switch n.Kind {
	case unstable.String:
		v.kind, v.s = vString, string(n.Data)
		if !utf8.ValidString(v.s) {
			d.errorf(v.pos, "the string is not valid UTF-8")
			return nil
		}
	case unstable.Bool:
		v.kind, v.b = vBool, string(n.Data) == "true"
	case unstable.Integer:
		i, err := parseInt(string(n.Data))
		if err != nil {
			d.errorf(v.pos, "%s is not an integer TOML can hold (%v)", n.Data, err)
			return nil
		}
		v.kind, v.i = vInt, i
	case unstable.Float:
		s := strings.ReplaceAll(string(n.Data), "_", "")
		f, err := strconv.ParseFloat(strings.TrimPrefix(s, "+"), 64)
		if err != nil && !strings.Contains(s, "inf") && !strings.Contains(s, "nan") {
			d.errorf(v.pos, "%s is not a number", n.Data)
			return nil
		}
		v.kind, v.f = vFloat, f
	case unstable.LocalDate, unstable.LocalTime, unstable.LocalDateTime, unstable.DateTime:
		v.kind = vDate
	case unstable.Array:
		v.kind = vArray
		it := n.Children()
		for it.Next() {
			c := it.Node()
			if c.Kind == unstable.Comment {
				continue
			}
			e := d.value(c, nil)
			if e == nil {
				return nil
			}
			if e.kind == vArray || e.kind == vTable {
				if e.pos.Line == 0 {
					e.pos = v.pos
				}
			}
			e.keyPos = e.pos
			v.arr = append(v.arr, e)
		}
	case unstable.InlineTable:
		v.kind = vTable
		v.tab = newTable(v.pos)
		v.tab.explicit = true
		v.tab.inline = true
		it := n.Children()
		for it.Next() {
			c := it.Node()
			if c.Kind != unstable.KeyValue {
				continue
			}
			d.keyValue(v.tab, c)
		}
	default:
		d.errorf(v.pos, "unexpected TOML value")
		return nil
	}
	return v
}

// containerPos finds where an array or inline table starts: inline tables
// know; for arrays, the first "[" after the "=" of their key/value, else the
// first element.
func (d *decoder) containerPos(n *unstable.Node, kv *unstable.Node) Pos {
	if n.Kind == unstable.InlineTable {
		return d.nodePos(n)
	}
	if kv != nil {
		raw := d.p.Raw(kv.Raw)
		if i := bytes.IndexByte(raw, '='); i >= 0 {
			if j := bytes.IndexByte(raw[i:], '['); j >= 0 {
				return d.src.pos(d.base + int(kv.Raw.Offset) + i + j)
			}
		}
	}
	it := n.Children()
	for it.Next() {
		c := it.Node()
		if c.Kind != unstable.Array && c.Kind != unstable.Comment {
			return d.nodePos(c)
		}
	}
	return Pos{}
}

func parseInt(s string) (int64, error) {
	s = strings.ReplaceAll(s, "_", "")
	base := 10
	neg := false
	switch {
	case strings.HasPrefix(s, "0x"):
		base, s = 16, s[2:]
	case strings.HasPrefix(s, "0o"):
		base, s = 8, s[2:]
	case strings.HasPrefix(s, "0b"):
		base, s = 2, s[2:]
	case strings.HasPrefix(s, "+"):
		s = s[1:]
	case strings.HasPrefix(s, "-"):
		s, neg = s[1:], true
	}
	u, err := strconv.ParseUint(s, base, 64)
	if err != nil {
		return 0, errors.Unwrap(err)
	}
	if neg {
		if u > 1<<63 {
			return 0, strconv.ErrRange
		}
		return -int64(u), nil
	}
	if u > 1<<63-1 {
		return 0, strconv.ErrRange
	}
	return int64(u), nil
}
