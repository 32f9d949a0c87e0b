package spec

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"cairnfs.dev/cairn/registry"
)

// InlineFile is the file name positions of the inline form carry.
const InlineFile = "inline"

// The inline form describes a chain of layers over one directory, top layer
// first, on one line:
//
//	inline  = chain ":" DIR { ":" DIR } | chain | DIR
//	chain   = layer { "," layer }
//	layer   = TYPE [ "(" [ option { "," option } ] ")" ]
//	option  = NAME "=" value
//	value   = '"' chars with \" and \\ escapes '"' | "'" chars "'" | bare
//	bare    = chars other than , ( ) " ' (spaces around it are dropped)
//	TYPE, NAME = letters, digits, - and _
//
// ":DIR" is short for ",local(path=DIR)"; DIR is the rest of the text, as is
// (but for spaces after the ":"); after a layer that takes several lowers
// it is several directories separated by ":" (mergerfs's branches).
// A chain without ":DIR" must end with a bottom layer. A text that starts
// with "/", "./", "../" or "~/", or that names an existing directory, is a
// DIR alone: local(path=DIR).
//
//	snoop(log=/tmp/a.jsonl),null:/srv/data
//	mux(names=a+b),null:./data
//
// Options take their values as text: true/false, 4096, "64KiB", "1s"; a list
// joins its elements with "+". Relative directories are relative to the
// current directory. Layers are named after their type ("null", and
// "null-2" for a second null layer); the directory's layer is "local".
// Spec.TOML prints the equivalent spec file.

type inlineLayer struct {
	typ     string
	typePos Pos
	opts    []inlineOpt
}

type inlineOpt struct {
	name           string
	namePos, vaPos Pos
	val            string
}

// ParseInline parses and checks the inline form.
func ParseInline(text string) (*Spec, error) {
	var errs ErrorList
	p := &inlineParser{s: text, errs: &errs}
	chain, dirs, dirPos := p.parse()
	s := &Spec{File: InlineFile, Inline: text, Layers: map[string]*Layer{}}
	if len(errs) > 0 {
		errs.fillLines(InlineFile, []byte(oneLine(text)))
		return s, errs.err()
	}
	root := inlineTable(chain, dirs, dirPos)
	c := &checker{errs: &errs, dir: ".", inline: true}
	s = c.spec(InlineFile, root, false)
	s.Inline = text
	s.text = []byte(oneLine(text))
	errs.fillLines(InlineFile, []byte(oneLine(text)))
	return s, errs.finish(InlineFile)
}

// LooksInline reports whether arg is meant as the inline form rather than a
// spec file: it names an existing directory, or it names no existing file,
// does not end in .toml, and either holds one of "(,:" or is a layer type.
func LooksInline(arg string) bool {
	if strings.HasSuffix(arg, ".toml") {
		return false
	}
	fi, err := os.Stat(arg)
	if err == nil {
		// A FIFO or a device is a spec file that Load refuses.
		return fi.IsDir()
	}
	if strings.ContainsAny(arg, "(,:") {
		return true
	}
	_, isType := registry.Lookup(strings.TrimSpace(arg))
	return isType
}

type inlineParser struct {
	s    string
	i    int
	errs *ErrorList
}

func (p *inlineParser) pos(i int) Pos { return Pos{File: InlineFile, Line: 1, Col: i + 1} }

func (p *inlineParser) errorf(i int, f string, a ...any) {
	*p.errs = append(*p.errs, &Error{Pos: p.pos(i), Msg: fmt.Sprintf(f, a...)})
}

func (p *inlineParser) found() string {
	if p.i >= len(p.s) {
		return "the end"
	}
	r, _ := utf8.DecodeRuneInString(p.s[p.i:])
	return strconv.QuoteRune(r)
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func (p *inlineParser) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *inlineParser) name() (string, int) {
	start := p.i
	for p.i < len(p.s) && isNameByte(p.s[p.i]) {
		p.i++
	}
	return p.s[start:p.i], start
}

func isDirText(s string) bool {
	for _, pre := range []string{"/", "./", "../", "~/"} {
		if strings.HasPrefix(s, pre) {
			return true
		}
	}
	if s == "." || s == ".." || s == "~" {
		return true
	}
	if strings.ContainsAny(s, "(,:") {
		return false
	}
	fi, err := os.Stat(s)
	return err == nil && fi.IsDir()
}

func (p *inlineParser) parse() ([]inlineLayer, []string, []Pos) {
	if !utf8.ValidString(p.s) {
		p.errorf(0, "the inline spec is not valid UTF-8")
		return nil, nil, nil
	}
	if strings.TrimSpace(p.s) == "" {
		p.errorf(0, "the inline spec is empty: expected a chain of layers over a directory, such as null:/srv/data")
		return nil, nil, nil
	}
	if isDirText(p.s) {
		return nil, []string{expandHome(p.s)}, []Pos{p.pos(0)}
	}
	var chain []inlineLayer
	for {
		p.space()
		typ, at := p.name()
		if typ == "" {
			if len(chain) == 0 {
				p.errorf(p.i, "expected a layer type (letters, digits, - and _) or a directory, found %s", p.found())
			} else {
				p.errorf(p.i, "expected a layer type after \",\", found %s", p.found())
			}
			return nil, nil, nil
		}
		l := inlineLayer{typ: typ, typePos: p.pos(at)}
		p.space()
		if p.i < len(p.s) && p.s[p.i] == '(' {
			p.i++
			if !p.options(&l) {
				return nil, nil, nil
			}
			p.space()
		}
		chain = append(chain, l)
		if p.i >= len(p.s) {
			return chain, nil, nil
		}
		switch p.s[p.i] {
		case ',':
			p.i++
			continue
		case ':':
			p.i++
			p.space()
			dir := p.s[p.i:]
			if dir == "" {
				p.errorf(p.i, "expected a directory after \":\", found the end")
				return nil, nil, nil
			}
			if t, ok := registry.Lookup(typ); ok && t.MaxLowers != 1 {
				// A layer over several lowers: its directories, as
				// mergerfs writes them, separated by ":".
				var dirs []string
				var at []Pos
				i := p.i
				for _, d := range strings.Split(dir, ":") {
					if strings.TrimSpace(d) == "" {
						p.errorf(i, "expected a directory between \":\" (layer type %q takes several: DIR:DIR...)", typ)
						return nil, nil, nil
					}
					dirs, at = append(dirs, expandHome(strings.TrimSpace(d))), append(at, p.pos(i))
					i += len(d) + 1
				}
				return chain, dirs, at
			}
			// "zstd:null:/srv/data" chains with ":": the directory would
			// be "null:/srv/data". Say how a chain is written (a real
			// directory of that name is taken as it is).
			if t, _, ok := strings.Cut(dir, ":"); ok && isLayerType(strings.TrimSpace(t)) {
				if _, err := os.Stat(expandHome(dir)); err != nil {
					fixed := p.s[:p.i-1] + "," + dir
					p.errorf(p.i, "the directory %q starts with the layer type %q: the layers of a chain are separated by \",\" (did you mean %q?)", dir, strings.TrimSpace(t), fixed)
					return nil, nil, nil
				}
			}
			return chain, []string{expandHome(dir)}, []Pos{p.pos(p.i)}
		}
		hint := ""
		if p.s[p.i] == '/' || p.s[p.i] == '.' {
			hint = " (to name a directory, start it with / or ./)"
		}
		p.errorf(p.i, "expected \"(\", \",\" or \":\" after layer type %q, found %s%s", typ, p.found(), hint)
		return nil, nil, nil
	}
}

// options parses "name=value, ...)" after the "(".
func (p *inlineParser) options(l *inlineLayer) bool {
	seen := map[string]bool{}
	for {
		p.space()
		if p.i < len(p.s) && p.s[p.i] == ')' && len(l.opts) == 0 {
			p.i++
			return true
		}
		name, at := p.name()
		if name == "" {
			p.errorf(p.i, "expected an option name in %s(...), found %s", l.typ, p.found())
			return false
		}
		if seen[name] {
			p.errorf(at, "option %q of %s is given twice", name, l.typ)
			return false
		}
		seen[name] = true
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != '=' {
			hint := ""
			if p.i >= len(p.s) || p.s[p.i] == ':' || p.s[p.i] == ',' {
				hint = fmt.Sprintf(" (is the \")\" that closes %s(...) missing?)", l.typ)
			}
			p.errorf(p.i, "expected \"=\" after option name %q, found %s%s", name, p.found(), hint)
			return false
		}
		p.i++
		p.space()
		vat := p.i
		val, ok := p.value()
		if !ok {
			return false
		}
		l.opts = append(l.opts, inlineOpt{name: name, namePos: p.pos(at), vaPos: p.pos(vat), val: val})
		p.space()
		if p.i >= len(p.s) {
			p.errorf(p.i, "expected \",\" or \")\" after the value of %q, found the end (close %s( with \")\")", name, l.typ)
			return false
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case ')':
			p.i++
			return true
		default:
			p.errorf(p.i, "expected \",\" or \")\" after the value of %q, found %s (quote a value that holds it)", name, p.found())
			return false
		}
	}
}

func (p *inlineParser) value() (string, bool) {
	if p.i < len(p.s) && (p.s[p.i] == '"' || p.s[p.i] == '\'') {
		q := p.s[p.i]
		start := p.i
		p.i++
		var b strings.Builder
		for p.i < len(p.s) {
			c := p.s[p.i]
			switch {
			case c == q:
				p.i++
				return b.String(), true
			case c == '\\' && q == '"':
				if p.i+1 < len(p.s) && (p.s[p.i+1] == '"' || p.s[p.i+1] == '\\') {
					b.WriteByte(p.s[p.i+1])
					p.i += 2
					continue
				}
				p.errorf(p.i, "in a \"quoted\" value, \\ must be followed by \" or \\")
				return "", false
			}
			b.WriteByte(c)
			p.i++
		}
		p.errorf(start, "the quoted value is not closed (expected a closing %c)", q)
		return "", false
	}
	start := p.i
	for p.i < len(p.s) && !strings.ContainsRune(",()\"'", rune(p.s[p.i])) {
		p.i++
	}
	return strings.TrimRight(p.s[start:p.i], " \t"), true
}

func expandHome(dir string) string {
	if dir == "~" || strings.HasPrefix(dir, "~/") {
		if h, err := os.UserHomeDir(); err == nil {
			return h + dir[1:]
		}
	}
	return dir
}

// inlineTable builds the same value tree a spec file gives, with positions
// in the inline text, so that one checker serves both forms.
func inlineTable(chain []inlineLayer, dirs []string, dirPos []Pos) *table {
	root := newTable(Pos{File: InlineFile, Line: 1, Col: 1})
	layers := newTable(root.pos)
	used := map[string]bool{}
	next := map[string]int{} // the next number to try for a type: linear in the layers
	nameOf := func(typ string) string {
		n := typ
		for used[n] {
			if next[typ] < 2 {
				next[typ] = 2
			}
			n = fmt.Sprintf("%s-%d", typ, next[typ])
			next[typ]++
		}
		used[n] = true
		return n
	}
	var names []string
	var tabs []*table
	for _, l := range chain {
		n := nameOf(l.typ)
		t := newTable(l.typePos)
		t.explicit = true
		t.set("type", &value{kind: vString, s: l.typ, pos: l.typePos, keyPos: l.typePos})
		for _, o := range l.opts {
			t.set(o.name, &value{kind: vString, s: o.val, raw: o.val, pos: o.vaPos, keyPos: o.namePos})
		}
		names = append(names, n)
		tabs = append(tabs, t)
	}
	chained := len(names)
	for k, dir := range dirs {
		n := nameOf("local")
		t := newTable(dirPos[k])
		t.set("type", &value{kind: vString, s: "local", pos: dirPos[k], keyPos: dirPos[k]})
		t.set("path", &value{kind: vString, s: dir, raw: dir, pos: dirPos[k], keyPos: dirPos[k]})
		names = append(names, n)
		tabs = append(tabs, t)
	}
	for i, n := range names {
		switch {
		case i+1 == chained && len(dirs) > 1:
			over := &value{kind: vArray, pos: tabs[i+1].pos, keyPos: tabs[i+1].pos}
			for k := range dirs {
				over.arr = append(over.arr, &value{kind: vString, s: names[chained+k], pos: dirPos[k], keyPos: dirPos[k]})
			}
			tabs[i].set("over", over)
		case i+1 < len(names) && i < chained:
			tabs[i].set("over", &value{kind: vString, s: names[i+1], pos: tabs[i+1].pos, keyPos: tabs[i+1].pos})
		}
		layers.set(n, &value{kind: vTable, tab: tabs[i], pos: tabs[i].pos, keyPos: tabs[i].pos})
	}
	root.set("mount", &value{kind: vString, s: names[0], pos: root.pos, keyPos: root.pos})
	root.set("layer", &value{kind: vTable, tab: layers, pos: root.pos, keyPos: root.pos})
	return root
}

// oneLine is the inline text as one line, for error carets: its positions
// count bytes from its start.
func oneLine(text string) string {
	return strings.NewReplacer("\n", " ", "\r", " ").Replace(text)
}

// isLayerType reports whether s names a registered layer type.
func isLayerType(s string) bool {
	_, ok := registry.Lookup(s)
	return ok
}
