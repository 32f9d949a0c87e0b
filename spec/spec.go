// Package spec reads a stack description: which layers stack over what, and
// which one is mounted. It is written as a TOML file or, for a chain of
// layers over one directory, inline on the command line (see ParseInline).
//
//	mount = "top"
//
//	[layer.base]
//	type = "local"
//	path = "/srv/data"
//
//	[layer.top]
//	type = "null"
//	over = "base"
//
// A layer over several lowers lists them: over = ["a", "b"]. Per-path rules
// are [[rule]] tables (see Rule). docs/spec.md is the reference.
//
// Parse checks everything that can be checked before mounting and reports
// every mistake at once, each with file:line:column (an ErrorList).
package spec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"cairnfs.dev/cairn/pathmatch"
	"cairnfs.dev/cairn/registry"
)

// Spec is a parsed and checked stack description.
type Spec struct {
	// File is the spec file's name, or "inline" for the inline form.
	File string
	// Inline is the inline text the spec came from ("" for a file).
	Inline string
	// Mount is the name of the mounted layer.
	Mount    string
	MountPos Pos
	// Layers by name; Order lists the names in the order they are defined.
	Layers map[string]*Layer
	Order  []string
	// Rules are the [[rule]] tables in order; each layer also has its own.
	Rules []*Rule
	// Mount options. A zero timeout means the default (1s); a negative one,
	// written "0s" in the spec, turns that cache off (as in fusefs.Options).
	AllowOther      bool
	NoXattr         bool // xattr = false: no extended attributes, fewer round trips
	Writeback       bool // writeback = true: the kernel's writeback cache (fusefs.Options.Writeback)
	EntryTimeout    time.Duration
	AttrTimeout     time.Duration
	NegativeTimeout time.Duration
	LogLevel        string
	// Given lists the mount options the spec sets, in order.
	Given []string
	text  []byte // the spec's text, for the lines of later errors
}

// Layer is one [layer.NAME] table.
type Layer struct {
	Name    string
	Type    string
	Over    []string
	Options map[string]any // raw, as written (inline values are strings)
	// Values are the options validated, with defaults filled in and
	// relative paths made absolute; the layer's rules are under
	// registry.RulesKey. Set when the layer has no errors.
	Values registry.Values
	Rules  []*Rule
	// Positions: the table, its type, each lower's name, each option.
	Pos, TypePos Pos
	OverPos      []Pos
	OptPos       map[string]Pos
	t            *registry.Type
}

// TypeInfo returns the layer's registered type (nil if it is unknown).
func (l *Layer) TypeInfo() *registry.Type { return l.t }

// Rule is one [[rule]] table: the layer it belongs to, which paths it
// applies to, and its options for that layer (validated against the layer
// type's RuleSpec).
type Rule struct {
	Pos     Pos
	Layer   string
	Match   []string
	Except  []string
	Options map[string]any
	Values  registry.Values
	Paths   *pathmatch.Set
}

// HasSecrets reports whether the spec sets a secret option (which must not
// be shown, as in the mount's source name in /proc/mounts).
func (s *Spec) HasSecrets() bool {
	for _, l := range s.Layers {
		if l.t == nil {
			continue
		}
		for _, o := range l.t.Options {
			if _, ok := l.Options[o.Name]; ok && o.Secret {
				return true
			}
		}
	}
	return false
}

// Mount option names, in the order they are documented.
var mountOptions = []string{"allow_other", "xattr", "writeback", "entry_timeout", "attr_timeout", "negative_timeout", "log_level"}

var topKeys = append([]string{"mount", "layer", "rule"}, mountOptions...)

// LogLevels are the accepted values of log_level.
var LogLevels = []string{"debug", "info", "warn", "error"}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// MaxFileSize is the largest spec file Load reads (1 MiB): a real spec is a
// few KiB.
const MaxFileSize = 1 << 20

// MaxDepth is the deepest stack a spec may describe: the most layers on the
// way from the mounted layer down to a bottom layer, both counted. Every
// operation passes through each layer on its way, one call inside another.
const MaxDepth = 64

// Load reads and parses a spec file. It must be a regular file (a FIFO or a
// device is refused rather than waited on) of at most MaxFileSize bytes.
func Load(path string) (*Spec, error) {
	// O_NONBLOCK: opening a FIFO must not wait for a writer.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("spec file %s is %s, not a regular file", path, fileKind(fi.Mode()))
	}
	if fi.Size() > MaxFileSize {
		return nil, fmt.Errorf("spec file %s is %d bytes; a spec file may hold at most %d bytes (1 MiB)", path, fi.Size(), MaxFileSize)
	}
	// The size may change while it is read: never read more than the limit.
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("spec file %s is larger than %d bytes, the most a spec file may hold (1 MiB)", path, MaxFileSize)
	}
	return Parse(path, data)
}

func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a FIFO (named pipe)"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m.IsDir():
		return "a directory"
	}
	return "a special file (" + m.String() + ")"
}

// Parse parses and checks a spec file's contents. Relative paths in it are
// relative to the file's directory. On error it returns an ErrorList with
// every mistake found (and the spec as far as it could be read).
func Parse(file string, data []byte) (*Spec, error) {
	var errs ErrorList
	data = bytes.TrimPrefix(data, []byte("\ufeff")) // a byte order mark: editors do not show it
	src := newSource(file, data)
	root := parseTOML(src, &errs)
	syntaxErrs := len(errs) > 0
	c := &checker{errs: &errs, dir: filepath.Dir(file)}
	s := c.spec(file, root, syntaxErrs)
	s.text = data
	errs.fillLines(file, data)
	return s, errs.finish(file)
}

// checker turns the value tree into a Spec, collecting errors.
type checker struct {
	errs *ErrorList
	dir  string // relative paths are relative to it
	pos0 Pos    // where to report what is missing from the whole file
	// inline: the spec comes from the inline form (hints differ)
	inline bool
	// partial: there were syntax errors, so parts of the spec are missing;
	// do not report what is missing.
	partial bool
}

func (c *checker) errorf(p Pos, f string, a ...any) {
	if len(*c.errs) < maxErrors {
		*c.errs = append(*c.errs, &Error{Pos: p, Msg: fmt.Sprintf(f, a...)})
	}
}

func (c *checker) spec(file string, root *table, partial bool) *Spec {
	s := &Spec{File: file, Layers: map[string]*Layer{}}
	c.partial = partial
	c.pos0 = Pos{File: file} // the whole spec
	var mountV, layersV, rulesV *value
	for _, k := range root.order {
		v := root.keys[k]
		switch k {
		case "mount":
			mountV = v
		case "layer":
			layersV = v
		case "rule":
			rulesV = v
		case "allow_other":
			if v.kind != vBool {
				c.errorf(v.pos, "allow_other must be true or false, found %s", v.describe())
				continue
			}
			s.AllowOther = v.b
			s.Given = append(s.Given, k)
		case "xattr":
			if v.kind != vBool {
				c.errorf(v.pos, "xattr must be true or false, found %s", v.describe())
				continue
			}
			s.NoXattr = !v.b
			s.Given = append(s.Given, k)
		case "writeback":
			if v.kind != vBool {
				c.errorf(v.pos, "writeback must be true or false, found %s", v.describe())
				continue
			}
			s.Writeback = v.b
			s.Given = append(s.Given, k)
		case "entry_timeout", "attr_timeout", "negative_timeout":
			d, ok := c.duration(k, v)
			if !ok {
				continue
			}
			if d == 0 {
				d = -1 // "0s": no caching (zero would mean the default)
			}
			switch k {
			case "entry_timeout":
				s.EntryTimeout = d
			case "attr_timeout":
				s.AttrTimeout = d
			default:
				s.NegativeTimeout = d
			}
			s.Given = append(s.Given, k)
		case "log_level":
			if v.kind != vString || !contains(LogLevels, v.s) {
				c.errorf(v.pos, "log_level must be one of %s, found %s", quoteOr(LogLevels), v.describe())
				continue
			}
			s.LogLevel = v.s
			s.Given = append(s.Given, k)
		default:
			what, hint := "key", didYouMean(k, topKeys)
			if v.kind == vTable {
				what = "table"
				if hint == "" {
					hint = fmt.Sprintf("; a layer is a [layer.NAME] table, as in [layer.%s]", k)
				}
			}
			c.errorf(v.keyPos, "unknown %s %q at the top level%s (expected %s)", what, k, hint, quoteOr(topKeys))
		}
	}
	c.layers(s, layersV)
	c.rules(s, rulesV)
	if mountV != nil {
		s.MountPos = mountV.pos
		if mountV.kind != vString {
			c.errorf(mountV.pos, "mount must be the name of a layer, as in mount = \"top\", found %s", mountV.describe())
		} else {
			s.Mount = mountV.s
		}
	}
	if !partial {
		c.graph(s, mountV)
	}
	return s
}

func (c *checker) duration(k string, v *value) (time.Duration, bool) {
	if v.kind != vString {
		c.errorf(v.pos, "%s must be a duration such as \"1s\" or \"250ms\", found %s", k, v.describe())
		return 0, false
	}
	d, err := time.ParseDuration(v.s)
	if err != nil || d < 0 {
		c.errorf(v.pos, "%s must be a duration such as \"1s\" or \"250ms\", found %s", k, v.describe())
		return 0, false
	}
	return d, true
}

func (c *checker) layers(s *Spec, v *value) {
	if v == nil {
		return
	}
	if v.kind != vTable {
		c.errorf(v.pos, "layer must hold the layers as [layer.NAME] tables, found %s", v.describe())
		return
	}
	for _, name := range v.tab.order {
		lv := v.tab.keys[name]
		if lv.kind != vTable {
			c.errorf(lv.pos, "layer.%s must be a table [layer.%s] with type = \"...\", found %s", name, name, lv.describe())
			continue
		}
		if !nameRE.MatchString(name) {
			c.errorf(lv.keyPos, "layer name %q may hold only letters, digits, - and _", name)
			continue
		}
		l := &Layer{Name: name, Options: map[string]any{}, OptPos: map[string]Pos{}, Pos: lv.tab.pos}
		s.Layers[name] = l
		s.Order = append(s.Order, name)
		c.layer(l, lv.tab)
	}
}

func (c *checker) layer(l *Layer, tab *table) {
	typeV := tab.keys["type"]
	switch {
	case typeV == nil && c.partial:
	case typeV == nil:
		c.errorf(l.Pos, "layer %q has no type: add type = \"...\" (one of %s)", l.Name, typeList())
	case typeV.kind != vString:
		c.errorf(typeV.pos, "the type of layer %q must be a string such as \"null\", found %s", l.Name, typeV.describe())
	default:
		l.Type, l.TypePos = typeV.s, typeV.pos
		t, ok := registry.Lookup(l.Type)
		if !ok {
			if dym := didYouMean(l.Type, typeNames()); dym != "" {
				c.errorf(typeV.pos, "unknown layer type %q%s", l.Type, dym)
			} else {
				c.errorf(typeV.pos, "unknown layer type %q (known types: %s)", l.Type, typeList())
			}
		} else {
			l.t = t
		}
	}
	if ov := tab.keys["over"]; ov != nil {
		switch ov.kind {
		case vString:
			l.Over, l.OverPos = []string{ov.s}, []Pos{ov.pos}
		case vArray:
			if len(ov.arr) == 0 {
				c.errorf(ov.pos, "over of layer %q is an empty list: name the layers it stacks over, or leave over out for a bottom layer", l.Name)
			}
			for _, e := range ov.arr {
				if e.kind != vString {
					c.errorf(e.pos, "over of layer %q must list layer names, found %s", l.Name, e.describe())
					continue
				}
				l.Over = append(l.Over, e.s)
				l.OverPos = append(l.OverPos, e.pos)
			}
		default:
			c.errorf(ov.pos, "over of layer %q must be a layer name or a list of names, found %s", l.Name, ov.describe())
		}
	}
	bad := false
	for _, k := range tab.order {
		if k == "type" || k == "over" {
			continue
		}
		v := tab.keys[k]
		l.Options[k] = v.plain()
		l.OptPos[k] = v.keyPos
		if l.t == nil {
			continue
		}
		if l.t.Option(k) == nil {
			bad = true
			hint := ""
			if contains(topKeys, k) && !c.inline {
				hint = fmt.Sprintf("; %s is a top-level key: move it above the first [table]", k)
			}
			c.errorf(v.keyPos, "layer %q (type %s) has no option %q%s (%s)%s", l.Name, l.t.Name, k,
				didYouMean(k, append(optionNames(l.t.Options), "type", "over")), optionsOf(l.t), hint)
			continue
		}
	}
	if l.t == nil {
		return
	}
	vals, ok := c.values(fmt.Sprintf("layer %q", l.Name), l.Pos, l.t.Options, tab)
	if ok && !bad {
		l.Values = vals
	}
}

// values validates the options of a layer or rule (keys of tab that are
// options; others were reported by the caller). what names the owner in
// errors.
func (c *checker) values(what string, at Pos, opts []registry.Option, tab *table) (registry.Values, bool) {
	vals := registry.Values{}
	ok := true
	for i := range opts {
		o := &opts[i]
		v := tab.keys[o.Name]
		if v == nil {
			if o.Required && c.partial {
				ok = false
			} else if o.Required {
				ok = false
				c.errorf(at, "%s is missing option %q: %s (%s)", what, o.Name, o.Help, kindWant(o))
			} else if d := o.DefaultValue(); d != nil {
				vals[o.Name] = d
			}
			continue
		}
		cv, err := c.convert(o, v)
		if err != nil {
			ok = false
			c.errorf(v.pos, "%s: %v", what, err)
			continue
		}
		vals[o.Name] = cv
	}
	return vals, ok
}

// convert checks one option value and makes paths absolute; a Dir must
// exist.
func (c *checker) convert(o *registry.Option, v *value) (any, error) {
	switch v.kind {
	case vDate, vTable, vFloat:
		return nil, fmt.Errorf("option %q must be %s, found %s", o.Name, kindWant(o), v.describe())
	}
	if v.kind == vArray && o.Kind != registry.List {
		return nil, fmt.Errorf("option %q must be %s, found %s", o.Name, kindWant(o), v.describe())
	}
	if o.Kind == registry.String && len(o.Allowed) > 0 && v.kind == vString && !contains(o.Allowed, v.s) {
		return nil, fmt.Errorf("option %q must be one of %s, found %s%s", o.Name, quoteOr(o.Allowed), v.describe(), didYouMean(v.s, o.Allowed))
	}
	cv, err := o.Convert(v.plain())
	if err != nil {
		return nil, fmt.Errorf("option %q must be %s, found %s", o.Name, kindWant(o), v.describe())
	}
	switch o.Kind {
	case registry.Size:
		if n, _ := cv.(int64); n < 0 {
			return nil, fmt.Errorf("option %q must be %s, found %s", o.Name, kindWant(o), v.describe())
		}
	case registry.Dir, registry.Path:
		p := cv.(string)
		if p == "" {
			return nil, fmt.Errorf("option %q must be %s, found an empty string", o.Name, kindWant(o))
		}
		if strings.ContainsRune(p, 0) {
			return nil, fmt.Errorf("option %q must be %s, found a path with a NUL byte", o.Name, kindWant(o))
		}
		p = expandHome(p)
		if !filepath.IsAbs(p) {
			p = filepath.Join(c.dir, p)
			if abs, err := filepath.Abs(p); err == nil {
				p = abs
			}
		}
		p = filepath.Clean(p)
		if o.Kind == registry.Dir {
			fi, err := os.Stat(p)
			switch {
			case err != nil && os.IsNotExist(err):
				return nil, fmt.Errorf("option %q: directory %s does not exist (create it first: mkdir -p %s)", o.Name, p, p)
			case err != nil:
				return nil, fmt.Errorf("option %q: directory %s: %v", o.Name, p, err)
			case !fi.IsDir():
				return nil, fmt.Errorf("option %q: %s is not a directory", o.Name, p)
			}
		}
		cv = p
	}
	if o.Check != nil {
		if err := o.Check(cv); err != nil {
			return nil, fmt.Errorf("option %q: %v", o.Name, err)
		}
	}
	return cv, nil
}

func (c *checker) rules(s *Spec, v *value) {
	if v == nil {
		return
	}
	if v.kind != vArray || !v.aot {
		c.errorf(v.keyPos, "rule must be written as [[rule]] tables (an array of tables), found %s", v.describe())
		return
	}
	for _, e := range v.arr {
		if e.kind != vTable {
			continue
		}
		c.rule(s, e.tab)
	}
}

var ruleKeys = []string{"layer", "match", "except"}

func (c *checker) rule(s *Spec, tab *table) {
	r := &Rule{Pos: tab.pos, Options: map[string]any{}}
	lv := tab.keys["layer"]
	var l *Layer
	switch {
	case lv == nil && c.partial:
	case lv == nil:
		c.errorf(r.Pos, "rule has no layer: add layer = \"NAME\", the layer it is for")
	case lv.kind != vString:
		c.errorf(lv.pos, "the layer of a rule must be a layer name, found %s", lv.describe())
	default:
		r.Layer = lv.s
		l = s.Layers[r.Layer]
		if l == nil {
			c.errorf(lv.pos, "rule is for layer %q, which is not defined%s", r.Layer, didYouMean(r.Layer, s.Order))
		} else if l.t != nil && l.t.Rules == nil {
			c.errorf(lv.pos, "rule is for layer %q of type %s, which takes no rules (types that do: %s)", r.Layer, l.t.Name, rulesTypes())
			l = nil
		}
	}
	var ok bool
	r.Match, ok = c.patterns(tab, "match", true)
	exc, ok2 := c.patterns(tab, "except", false)
	r.Except = exc
	if ok && ok2 {
		r.Paths, _ = pathmatch.NewSet(r.Match, r.Except)
	}
	var t *registry.Type
	if l != nil {
		t = l.t
	}
	bad := false
	for _, k := range tab.order {
		if contains(ruleKeys, k) {
			continue
		}
		v := tab.keys[k]
		r.Options[k] = v.plain()
		if t == nil {
			continue
		}
		if t.RuleOption(k) == nil {
			bad = true
			c.errorf(v.keyPos, "a rule for layer %q (type %s) has no option %q%s (%s)", l.Name, t.Name, k,
				didYouMean(k, append(optionNames(t.Rules.Options), ruleKeys...)), ruleOptionsOf(t))
		}
	}
	if t != nil {
		if vals, ok := c.values(fmt.Sprintf("rule for layer %q", l.Name), r.Pos, t.Rules.Options, tab); ok && !bad {
			r.Values = vals
		}
	}
	s.Rules = append(s.Rules, r)
	if l != nil {
		l.Rules = append(l.Rules, r)
	}
}

// patterns reads match or except: a pattern or a list of them.
func (c *checker) patterns(tab *table, key string, required bool) ([]string, bool) {
	v := tab.keys[key]
	if v == nil {
		if required && c.partial {
			return nil, false
		}
		if required {
			c.errorf(tab.pos, "rule has no match: add match = \"PATTERN\" or a list of patterns, such as \"*.log\" or \"docs/**\"")
			return nil, false
		}
		return nil, true
	}
	var vals []*value
	switch v.kind {
	case vString:
		vals = []*value{v}
	case vArray:
		vals = v.arr
		if len(vals) == 0 && required {
			c.errorf(v.pos, "match is an empty list: the rule would apply to nothing")
			return nil, false
		}
	default:
		c.errorf(v.pos, "%s must be a pattern such as \"*.log\" or a list of patterns, found %s", key, v.describe())
		return nil, false
	}
	ok := true
	var out []string
	for _, e := range vals {
		if e.kind != vString {
			c.errorf(e.pos, "%s must list patterns (strings), found %s", key, e.describe())
			ok = false
			continue
		}
		if _, err := pathmatch.Compile(e.s); err != nil {
			p := e.pos
			if pe, isPE := err.(*pathmatch.Error); isPE {
				p.Col += 1 + pe.Offset // past the opening quote; exact unless escapes come first
				c.errorf(p, "bad pattern %q: %s", e.s, pe.Msg)
			} else {
				c.errorf(p, "%v", err)
			}
			ok = false
			continue
		}
		out = append(out, e.s)
	}
	return out, ok
}

// graph checks how the layers stack: the mount, lower names, lower counts,
// cycles, sharing, unused layers. It also puts each layer's rules into its
// values.
func (c *checker) graph(s *Spec, mountV *value) {
	if len(s.Layers) == 0 {
		c.errorf(c.pos0, "the spec defines no layer: add [layer.NAME] tables, such as\n\n    [layer.data]\n    type = \"local\"\n    path = \"/srv/data\"")
	}
	switch {
	case mountV == nil:
		hint := ""
		if len(s.Order) > 0 {
			hint = fmt.Sprintf(", such as mount = %q", guessTop(s))
		}
		c.errorf(c.pos0, "missing mount = \"NAME\" at the top level: which layer is mounted%s", hint)
	case s.Mount != "" && s.Layers[s.Mount] == nil && len(s.Layers) > 0:
		c.errorf(s.MountPos, "mount names layer %q, which is not defined%s (layers: %s)", s.Mount, didYouMean(s.Mount, s.Order), quoteAnd(s.Order))
	}
	usedBy := map[string]string{}
	for _, name := range s.Order {
		if c.full() {
			break // the messages below list every layer: do not build them for nothing
		}
		l := s.Layers[name]
		seen := map[string]bool{}
		for i, o := range l.Over {
			p := l.OverPos[i]
			switch {
			case o == name:
				c.errorf(p, "layer %q stacks over itself", name)
			case s.Layers[o] == nil:
				c.errorf(p, "layer %q stacks over %q, which is not defined%s (layers: %s)", name, o, didYouMean(o, s.Order), quoteAnd(s.Order))
			case seen[o]:
				c.errorf(p, "layer %q lists %q twice in over", name, o)
			case usedBy[o] != "":
				c.errorf(p, "layer %q is already under layer %q (line %d); a layer can be under only one other (define a second layer of the same type for a second view)", o, usedBy[o], s.Layers[usedBy[o]].Pos.Line)
			default:
				usedBy[o] = name
			}
			seen[o] = true
		}
		if t := l.t; t != nil {
			n := len(l.Over)
			if n < t.MinLowers || (t.MaxLowers >= 0 && n > t.MaxLowers) {
				p := l.Pos
				if len(l.OverPos) > 0 {
					p = l.OverPos[0]
				}
				switch {
				case t.MaxLowers == 0 && c.inline:
					c.errorf(l.Pos, "%s is a bottom layer: it must come last, and nothing (no \":DIR\") may follow it", t.Name)
				case t.MaxLowers == 0:
					c.errorf(p, "layer %q is of type %s, a bottom layer: it stacks over nothing, so remove over", name, t.Name)
				case n == 0 && c.inline:
					c.errorf(l.Pos, "%s stacks over another layer: end the chain with \":DIR\", as in %s:/srv/data", t.Name, t.Name)
				case n == 0:
					c.errorf(p, "layer %q (type %s) stacks over nothing: add over = \"NAME\" (it takes %s)", name, t.Name, lowersN(t))
				default:
					c.errorf(p, "layer %q (type %s) stacks over %d layers (%s); it takes %s", name, t.Name, n, quoteAnd(l.Over), lowersN(t))
				}
			}
		}
	}
	// Cycles: each reported once, where it closes.
	state := map[string]int{} // 0 new, 1 on the path, 2 done
	var path []string
	var visit func(string)
	visit = func(name string) {
		state[name] = 1
		path = append(path, name)
		l := s.Layers[name]
		for i, o := range l.Over {
			if s.Layers[o] == nil || o == name {
				continue
			}
			switch state[o] {
			case 0:
				visit(o)
			case 1:
				if c.full() {
					continue
				}
				j := indexOf(path, o)
				cyc := append(append([]string{}, path[j:]...), o)
				c.errorf(l.OverPos[i], "layers stack in a cycle: %s", strings.Join(cyc, " over "))
			}
		}
		path = path[:len(path)-1]
		state[name] = 2
	}
	for _, name := range s.Order {
		if state[name] == 0 {
			visit(name)
		}
	}
	c.depth(s)
	// Unused layers.
	if l := s.Layers[s.Mount]; l != nil {
		reach := map[string]bool{}
		var mark func(string)
		mark = func(n string) {
			if reach[n] || s.Layers[n] == nil {
				return
			}
			reach[n] = true
			for _, o := range s.Layers[n].Over {
				mark(o)
			}
		}
		mark(s.Mount)
		for _, name := range s.Order {
			if !reach[name] && usedBy[name] == "" {
				c.errorf(s.Layers[name].Pos, "layer %q is not used: it is not mounted and no layer stacks over it", name)
			}
		}
	}
	for _, l := range s.Layers {
		if l.Values != nil && l.t != nil && l.t.Rules != nil {
			var rules registry.Rules
			for _, r := range l.Rules {
				if r.Paths != nil && r.Values != nil {
					rules = append(rules, registry.Rule{Where: r.Pos.String(), Paths: r.Paths, Values: r.Values})
				}
			}
			l.Values[registry.RulesKey] = rules
		}
	}
	for _, name := range s.Order {
		l := s.Layers[name]
		if c.partial || l.Values == nil || l.t == nil || l.t.Check == nil {
			continue
		}
		if err := l.t.Check(l.Values, len(l.Over)); err != nil {
			pos := l.Pos
			var oe *registry.OptionError
			if errors.As(err, &oe) && l.OptPos[oe.Option].Line != 0 {
				pos = l.OptPos[oe.Option]
			}
			c.errorf(pos, "layer %q (type %s): %v", l.Name, l.t.Name, err)
		}
	}
	for _, name := range s.Order {
		l := s.Layers[name]
		if c.partial || l.Values == nil || l.t == nil || l.t.CheckDirs == nil {
			continue
		}
		dirs := make([][]string, len(l.Over))
		for i, o := range l.Over {
			dirs[i] = s.dirsBelow(o, map[string]bool{})
		}
		if err := l.t.CheckDirs(dirs); err != nil {
			pos := l.Pos
			var le *registry.LowerError
			if errors.As(err, &le) && le.Index < len(l.OverPos) {
				pos = l.OverPos[le.Index]
			}
			c.errorf(pos, "layer %q (type %s): %v", l.Name, l.t.Name, err)
		}
	}
}

// dirsBelow are the values of the dir options of layer name and of every
// layer below it, symbolic links resolved (for Type.CheckDirs).
func (s *Spec) dirsBelow(name string, seen map[string]bool) []string {
	l := s.Layers[name]
	if l == nil || seen[name] {
		return nil
	}
	seen[name] = true
	var out []string
	if l.t != nil {
		for _, o := range l.t.Options {
			if v, ok := l.Values[o.Name].(string); ok && o.Kind == registry.Dir && v != "" {
				if r, err := realPath(v); err == nil {
					v = r
				}
				out = append(out, v)
			}
		}
	}
	for _, o := range l.Over {
		out = append(out, s.dirsBelow(o, seen)...)
	}
	return out
}

// depth reports a stack deeper than MaxDepth, at the first layer too deep.
// It walks down from the mounted layer without recursion, each layer once.
func (c *checker) depth(s *Spec) {
	if s.Layers[s.Mount] == nil {
		return
	}
	type item struct {
		name  string
		depth int
	}
	todo := []item{{s.Mount, 1}}
	seen := map[string]bool{s.Mount: true}
	for len(todo) > 0 {
		it := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		l := s.Layers[it.name]
		if it.depth > MaxDepth {
			c.errorf(l.Pos, "the stack is too deep: layer %q is layer %d down from the mounted layer %q, and a stack may be at most %d layers deep", it.name, it.depth, s.Mount, MaxDepth)
			return
		}
		for _, o := range l.Over {
			if s.Layers[o] != nil && !seen[o] {
				seen[o] = true
				todo = append(todo, item{o, it.depth + 1})
			}
		}
	}
}

// full reports whether no more errors are kept.
func (c *checker) full() bool { return len(*c.errs) >= maxErrors }

// guessTop suggests a mount: the first layer nothing stacks over.
func guessTop(s *Spec) string {
	under := map[string]bool{}
	for _, l := range s.Layers {
		for _, o := range l.Over {
			under[o] = true
		}
	}
	for _, n := range s.Order {
		if !under[n] {
			return n
		}
	}
	return s.Order[0]
}

func lowersN(t *registry.Type) string {
	switch {
	case t.MinLowers == t.MaxLowers && t.MinLowers == 1:
		return "exactly 1"
	case t.MaxLowers < 0:
		return fmt.Sprintf("at least %d", t.MinLowers)
	}
	return t.LowersText()
}

// kindWant says what an option expects, for "must be ...".
func kindWant(o *registry.Option) string {
	switch o.Kind {
	case registry.String:
		if len(o.Allowed) > 0 {
			return "one of " + quoteOr(o.Allowed)
		}
		return "a string"
	case registry.Int:
		return "an integer"
	case registry.Bool:
		return "true or false"
	case registry.Duration:
		return "a duration such as \"1s\" or \"250ms\""
	case registry.Size:
		return "a size such as 4096 or \"64KiB\""
	case registry.Dir:
		return "a directory path"
	case registry.Path:
		return "a file path"
	case registry.List:
		return "a list of strings"
	}
	return string(o.Kind)
}

// KindWant says in words what values an option takes.
func KindWant(o *registry.Option) string { return kindWant(o) }

func typeNames() []string {
	var n []string
	for _, t := range registry.Types() {
		n = append(n, t.Name)
	}
	return n
}

func typeList() string { return strings.Join(typeNames(), ", ") }

func rulesTypes() string {
	var n []string
	for _, t := range registry.Types() {
		if t.Rules != nil {
			n = append(n, t.Name)
		}
	}
	if len(n) == 0 {
		return "none yet"
	}
	return strings.Join(n, ", ")
}

func optionNames(opts []registry.Option) []string {
	var n []string
	for _, o := range opts {
		n = append(n, o.Name)
	}
	return n
}

func optionsOf(t *registry.Type) string {
	if len(t.Options) == 0 {
		return t.Name + " takes no options"
	}
	return "options of " + t.Name + ": " + strings.Join(optionNames(t.Options), ", ")
}

func ruleOptionsOf(t *registry.Type) string {
	n := append(append([]string{}, ruleKeys...), optionNames(t.Rules.Options)...)
	return "rule keys: " + strings.Join(n, ", ")
}

func quoteOr(n []string) string {
	q := make([]string, len(n))
	for i, s := range n {
		q[i] = fmt.Sprintf("%q", s)
	}
	return orList(q)
}

func quoteAnd(n []string) string { return quoteList(n) }

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func indexOf(l []string, s string) int {
	for i, x := range l {
		if x == s {
			return i
		}
	}
	return -1
}

// sortedKeys returns a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for x := range m {
		k = append(k, x)
	}
	sort.Strings(k)
	return k
}
