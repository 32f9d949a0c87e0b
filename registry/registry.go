// Package registry holds the layer types that a stack spec can name. Each
// layer package registers its type once, in an init function: its name, a
// one-line summary, its options and its constructor. Adding a layer type
// means one package and one registration.
package registry

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/pathmatch"
)

// Kind is an option's type.
type Kind string

const (
	String   Kind = "string"
	Int      Kind = "int"
	Bool     Kind = "bool"
	Duration Kind = "duration" // "1s", "250ms"
	Size     Kind = "size"     // bytes: 4096, "64KiB", "1MiB"
	Dir      Kind = "dir"      // a directory that must exist; the stack's lower storage
	Path     Kind = "path"     // a file path
	List     Kind = "list"     // a list of strings
)

// Option describes one option of a layer type.
type Option struct {
	Name     string
	Kind     Kind
	Default  any // nil: no default
	Required bool
	Allowed  []string // for String: the accepted values
	Secret   bool     // masked by explain and in logs
	Help     string
	// Check, when not nil, checks the converted value further (a user
	// name that exists, a program that can be found); cairn check reports
	// its error at the value.
	Check func(v any) error
}

// Type is a layer type.
type Type struct {
	Name    string
	Summary string
	// MinLowers and MaxLowers bound how many layers it stacks over
	// (MaxLowers < 0: no limit). A bottom layer has 0 and 0.
	MinLowers, MaxLowers int
	Options              []Option
	// Changes is what the type changes (for explain before building).
	Changes layer.Changes
	// PerFile says that the type changes the data of some files only
	// (chains: the guarded ones), and hands the others on as its lower
	// gives them, kernel passthrough included (explain says "partly").
	PerFile bool
	// NoPassthrough, when not nil, says from a layer's parsed options and
	// rules whether it keeps its files from the kernel although it changes
	// no data (a hook that must see every read and write): a reason, such
	// as "rule 1 (stack.toml:9:1) can fire on reads and writes", or "" when
	// its files keep kernel passthrough. cairn explain reads it, since the
	// layer decides at run time.
	NoPassthrough func(v Values) string
	// Lacks is what the type cannot do whatever its lowers can (for
	// explain before building; the built layer says it with
	// layer.FSCapser).
	Lacks layer.FSCaps
	// Explain, if set, gives lines for cairn explain that say what the
	// options make of the layer's lowers (a union's branches and their
	// modes); over names the lowers, in order.
	Explain func(v Values, over []string) []string
	// Finds says that the type finds its objects by identity
	// (layer.Finder), which file handles of the mount need from a bottom
	// layer and from a layer that changes names or placement (for explain
	// before building).
	Finds bool
	// Check, when not nil, checks what single options cannot: options
	// that go together (a log file for a file output), or the options
	// against the number of lowers. cairn check and cairn mount both call
	// it, before anything is built, so that check refuses whatever New
	// would; an *OptionError places the error at that option.
	Check func(opts Values, lowers int) error
	// CheckDirs, when not nil, checks the directories each lower is
	// stored in (the values of the dir options of the layers below it,
	// symbolic links resolved): a replica's lowers may not be one
	// directory, nor one inside another. A *LowerError places the error at
	// that lower in over.
	CheckDirs func(dirs [][]string) error
	// New builds the layer over its lowers with validated options.
	New func(lowers []layer.FS, opts Values) (layer.FS, error)
	// Rules, when not nil, says that the type takes per-path [[rule]]
	// tables; they reach New in opts (see Values.Rules).
	Rules *RuleSpec
	// Secret, when not nil, obtains a secret the layer needs to be built
	// (a passphrase), where a person can still be asked for it: cairn
	// mount calls it in the foreground, before it goes to the background,
	// and hands the result to New in opts (see Values.Secret), never
	// through the command line or the environment.
	Secret func(opts Values) ([]byte, error)
}

// OptionError is an error of a Type's Check about one option (or a missing
// one): cairn check reports it at that option's value (or at the layer).
type OptionError struct {
	Option string
	Err    error
}

func (e *OptionError) Error() string { return fmt.Sprintf("option %q: %v", e.Option, e.Err) }
func (e *OptionError) Unwrap() error { return e.Err }

// LowerError is an error of a Type's CheckDirs about one lower (0 is the
// first of over).
type LowerError struct {
	Index int
	Err   error
}

func (e *LowerError) Error() string { return e.Err.Error() }
func (e *LowerError) Unwrap() error { return e.Err }

// RuleSpec describes the [[rule]] tables a layer type takes.
type RuleSpec struct {
	// Help says what a rule means for this type (one sentence).
	Help string
	// Options are the rule's keys besides layer, match and except.
	Options []Option
}

// RuleOption returns the named rule option, or nil.
func (t *Type) RuleOption(name string) *Option {
	if t.Rules == nil {
		return nil
	}
	for i := range t.Rules.Options {
		if t.Rules.Options[i].Name == name {
			return &t.Rules.Options[i]
		}
	}
	return nil
}

// LowersText says how many lowers the type takes, in words.
func (t *Type) LowersText() string {
	switch {
	case t.MaxLowers == 0:
		return "none (a bottom layer)"
	case t.MinLowers == t.MaxLowers:
		return fmt.Sprintf("exactly %d", t.MinLowers)
	case t.MaxLowers < 0:
		return fmt.Sprintf("at least %d", t.MinLowers)
	}
	return fmt.Sprintf("%d to %d", t.MinLowers, t.MaxLowers)
}

// RulesKey is the key under which a layer's rules arrive in Values. It is
// not an option name: Register refuses options called "type", "over" or
// "rule" (and rule options called "layer", "match" or "except").
const RulesKey = "rule"

// Rule is one validated [[rule]] table of a layer.
type Rule struct {
	// Where is the rule's position in its spec ("stack.toml:12:1"), for logs.
	Where string
	// Paths are the paths the rule applies to (its match and except).
	Paths *pathmatch.Set
	// Values are the rule's options, with defaults filled in.
	Values Values
}

// Rules are a layer's rules, in the order of the spec.
type Rules []Rule

// First returns the first rule that applies to path.
func (r Rules) First(path string) (Rule, bool) {
	for _, x := range r {
		if x.Paths.Contains(path) {
			return x, true
		}
	}
	return Rule{}, false
}

// All returns every rule that applies to path, in order.
func (r Rules) All(path string) []Rule {
	var out []Rule
	for _, x := range r {
		if x.Paths.Contains(path) {
			out = append(out, x)
		}
	}
	return out
}

// SecretKey is the key under which the result of Type.Secret arrives in
// Values; it cannot be an option's name.
const SecretKey = "\x00secret"

// Secret returns what Type.Secret obtained (nil if it was not called).
func (v Values) Secret() []byte {
	b, _ := v[SecretKey].([]byte)
	return b
}

// Rules returns the layer's [[rule]] tables (none if the spec has none).
func (v Values) Rules() Rules {
	r, _ := v[RulesKey].(Rules)
	return r
}

// Option returns the named option, or nil.
func (t *Type) Option(name string) *Option {
	for i := range t.Options {
		if t.Options[i].Name == name {
			return &t.Options[i]
		}
	}
	return nil
}

var (
	mu    sync.RWMutex
	types = map[string]*Type{}
)

// Register adds a layer type. It panics on a duplicate name: that is a
// programming error found at start-up.
func Register(t Type) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := types[t.Name]; dup {
		panic("registry: layer type registered twice: " + t.Name)
	}
	for _, o := range t.Options {
		switch o.Name {
		case "type", "over", RulesKey:
			panic("registry: layer type " + t.Name + ": option name " + o.Name + " is reserved by the spec")
		}
	}
	if t.Rules != nil {
		for _, o := range t.Rules.Options {
			switch o.Name {
			case "layer", "match", "except":
				panic("registry: layer type " + t.Name + ": rule option name " + o.Name + " is reserved by the spec")
			}
		}
	}
	types[t.Name] = &t
}

// Lookup returns the layer type called name.
func Lookup(name string) (*Type, bool) {
	mu.RLock()
	defer mu.RUnlock()
	t, ok := types[name]
	return t, ok
}

// Types returns all layer types, sorted by name.
func Types() []*Type {
	mu.RLock()
	defer mu.RUnlock()
	var out []*Type
	for _, t := range types {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Values are a layer's validated options, with defaults filled in.
type Values map[string]any

func (v Values) String(name string) string {
	s, _ := v[name].(string)
	return s
}
func (v Values) Int(name string) int64 {
	n, _ := v[name].(int64)
	return n
}
func (v Values) Bool(name string) bool {
	b, _ := v[name].(bool)
	return b
}
func (v Values) Duration(name string) time.Duration {
	d, _ := v[name].(time.Duration)
	return d
}
func (v Values) List(name string) []string {
	l, _ := v[name].([]string)
	return l
}

// Convert checks a raw value (from TOML or the inline form) against the
// option's kind and returns the typed value. Inline values arrive as strings.
func (o *Option) Convert(raw any) (any, error) {
	switch o.Kind {
	case String, Dir, Path:
		s, ok := raw.(string)
		if !ok {
			return nil, fmt.Errorf("option %q must be a string, found %s", o.Name, describe(raw))
		}
		if len(o.Allowed) > 0 && !contains(o.Allowed, s) {
			return nil, fmt.Errorf("option %q must be one of %s, found %q", o.Name, strings.Join(o.Allowed, ", "), s)
		}
		return s, nil
	case Int:
		switch x := raw.(type) {
		case int64:
			return x, nil
		case int:
			return int64(x), nil
		case string:
			n, err := strconv.ParseInt(x, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("option %q must be an integer, found %q", o.Name, x)
			}
			return n, nil
		}
		return nil, fmt.Errorf("option %q must be an integer, found %s", o.Name, describe(raw))
	case Bool:
		switch x := raw.(type) {
		case bool:
			return x, nil
		case string:
			b, err := strconv.ParseBool(x)
			if err != nil {
				return nil, fmt.Errorf("option %q must be true or false, found %q", o.Name, x)
			}
			return b, nil
		}
		return nil, fmt.Errorf("option %q must be true or false, found %s", o.Name, describe(raw))
	case Duration:
		s, ok := raw.(string)
		if !ok {
			return nil, fmt.Errorf("option %q must be a duration such as \"1s\", found %s", o.Name, describe(raw))
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("option %q must be a duration such as \"1s\" or \"250ms\", found %q", o.Name, s)
		}
		return d, nil
	case Size:
		switch x := raw.(type) {
		case int64:
			return x, nil
		case int:
			return int64(x), nil
		case string:
			n, err := ParseSize(x)
			if err != nil {
				return nil, fmt.Errorf("option %q: %v", o.Name, err)
			}
			return n, nil
		}
		return nil, fmt.Errorf("option %q must be a size such as 4096 or \"64KiB\", found %s", o.Name, describe(raw))
	case List:
		switch x := raw.(type) {
		case string:
			if x == "" {
				return []string{}, nil
			}
			return strings.Split(x, "+"), nil
		case []any:
			var out []string
			for _, e := range x {
				s, ok := e.(string)
				if !ok {
					return nil, fmt.Errorf("option %q must be a list of strings, found an element %s", o.Name, describe(e))
				}
				out = append(out, s)
			}
			return out, nil
		case []string:
			return x, nil
		}
		return nil, fmt.Errorf("option %q must be a list of strings, found %s", o.Name, describe(raw))
	}
	return nil, fmt.Errorf("option %q has unknown kind %q", o.Name, o.Kind)
}

// DefaultValue returns the option's default in the type Values holds
// (int64 for Int and Size, time.Duration for Duration, []string for List),
// so that a default written as 3, "1s" or "64KiB" reads back with
// Values.Int and friends. It returns nil when there is no default.
func (o *Option) DefaultValue() any {
	switch d := o.Default.(type) {
	case nil:
		return nil
	case int:
		if o.Kind == Int || o.Kind == Size {
			return int64(d)
		}
	case int64, time.Duration, bool, []string:
		return d
	case string:
		if v, err := o.Convert(d); err == nil {
			return v
		}
	}
	return o.Default
}

// ParseSize parses 4096, "4k", "64KiB", "1MiB", "2G".
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	lower := strings.ToLower(t)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30}, {"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"b", 1}} {
		if strings.HasSuffix(lower, u.suf) {
			mult = u.m
			t = strings.TrimSpace(t[:len(t)-len(u.suf)])
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("a size must be a number of bytes such as 4096, \"64KiB\" or \"1MiB\", found %q", s)
	}
	return n * mult, nil
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func describe(v any) string {
	switch v.(type) {
	case string:
		return fmt.Sprintf("the string %q", v)
	case int64, int:
		return fmt.Sprintf("the integer %v", v)
	case bool:
		return fmt.Sprintf("the boolean %v", v)
	case []any:
		return "a list"
	case map[string]any:
		return "a table"
	case float64:
		return fmt.Sprintf("the number %v", v)
	}
	return fmt.Sprintf("%T", v)
}
