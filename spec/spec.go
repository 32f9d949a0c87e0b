// Package spec reads a stack description: which layers stack over what, and
// which one is mounted.
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
// A layer over several lowers lists them: over = ["a", "b"].
package spec

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"cairn/layer"
	"cairn/registry"
)

// Spec is a parsed stack description.
type Spec struct {
	File   string
	Mount  string
	Layers map[string]*Layer
	// Mount options.
	AllowOther      bool
	EntryTimeout    time.Duration
	AttrTimeout     time.Duration
	NegativeTimeout time.Duration
	LogLevel        string
}

// Layer is one [layer.NAME] table.
type Layer struct {
	Name    string
	Type    string
	Over    []string
	Options map[string]any // raw, as written
}

// Load reads and parses a spec file.
func Load(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse parses a spec.
func Parse(file string, data []byte) (*Spec, error) {
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s:%d:%d: %s", file, pe.Position.Line, pe.Position.Col, pe.Message)
		}
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	s := &Spec{File: file, Layers: map[string]*Layer{}}
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf("%s: "+f, append([]any{file}, a...)...)) }
	for k, v := range raw {
		switch k {
		case "mount":
			s.Mount, _ = v.(string)
		case "allow_other":
			s.AllowOther, _ = v.(bool)
		case "log_level":
			s.LogLevel, _ = v.(string)
		case "entry_timeout", "attr_timeout", "negative_timeout":
			str, _ := v.(string)
			d, err := time.ParseDuration(str)
			if err != nil {
				bad("%s must be a duration such as \"1s\", found %v", k, v)
				continue
			}
			switch k {
			case "entry_timeout":
				s.EntryTimeout = d
			case "attr_timeout":
				s.AttrTimeout = d
			default:
				s.NegativeTimeout = d
			}
		case "layer":
			tabs, ok := v.(map[string]any)
			if !ok {
				bad("layer must be a table of [layer.NAME] tables")
				continue
			}
			for name, t := range tabs {
				tab, ok := t.(map[string]any)
				if !ok {
					bad("layer.%s must be a table", name)
					continue
				}
				l := &Layer{Name: name, Options: map[string]any{}}
				for ok, ov := range tab {
					switch ok {
					case "type":
						l.Type, _ = ov.(string)
					case "over":
						switch o := ov.(type) {
						case string:
							l.Over = []string{o}
						case []any:
							for _, e := range o {
								if es, ok := e.(string); ok {
									l.Over = append(l.Over, es)
								}
							}
						}
					default:
						l.Options[ok] = ov
					}
				}
				s.Layers[name] = l
			}
		default:
			bad("unknown key %q (expected mount, layer, allow_other, entry_timeout, attr_timeout, negative_timeout or log_level)", k)
		}
	}
	if s.Mount == "" {
		bad("missing mount = \"NAME\": which layer is mounted")
	} else if _, ok := s.Layers[s.Mount]; !ok {
		bad("mount names layer %q, which is not defined", s.Mount)
	}
	return s, errors.Join(errs...)
}

// Stack is a built stack.
type Stack struct {
	Top    layer.FS
	Layers map[string]layer.FS
	// Dirs are the local directories the stack keeps its data in.
	Dirs []string
}

// Close closes every layer of the stack.
func (st *Stack) Close() error { return layer.CloseStack(st.Top) }

// Build constructs the layers, bottom first.
func (s *Spec) Build() (*Stack, error) {
	st := &Stack{Layers: map[string]layer.FS{}}
	building := map[string]bool{}
	var build func(name string) (layer.FS, error)
	build = func(name string) (layer.FS, error) {
		if fs, ok := st.Layers[name]; ok {
			return fs, nil
		}
		if building[name] {
			return nil, fmt.Errorf("%s: layer %q stacks over itself (a cycle)", s.File, name)
		}
		building[name] = true
		l, ok := s.Layers[name]
		if !ok {
			return nil, fmt.Errorf("%s: layer %q is not defined", s.File, name)
		}
		t, ok := registry.Lookup(l.Type)
		if !ok {
			return nil, fmt.Errorf("%s: layer %q: unknown type %q (known: %s)", s.File, name, l.Type, typeNames())
		}
		if len(l.Over) < t.MinLowers || (t.MaxLowers >= 0 && len(l.Over) > t.MaxLowers) {
			return nil, fmt.Errorf("%s: layer %q of type %s stacks over %d layers; it takes %s", s.File, name, t.Name, len(l.Over), lowersWanted(t))
		}
		var lowers []layer.FS
		for _, o := range l.Over {
			fs, err := build(o)
			if err != nil {
				return nil, err
			}
			lowers = append(lowers, fs)
		}
		vals, dirs, err := Values(t, l.Options)
		if err != nil {
			return nil, fmt.Errorf("%s: layer %q: %w", s.File, name, err)
		}
		fs, err := t.New(lowers, vals)
		if err != nil {
			return nil, fmt.Errorf("%s: layer %q: %w", s.File, name, err)
		}
		st.Dirs = append(st.Dirs, dirs...)
		st.Layers[name] = fs
		return fs, nil
	}
	top, err := build(s.Mount)
	if err != nil {
		for _, fs := range st.Layers {
			fs.Close()
		}
		return nil, err
	}
	st.Top = top
	return st, nil
}

// Values validates raw options against a layer type and fills defaults. It
// also returns the values of Dir options.
func Values(t *registry.Type, raw map[string]any) (registry.Values, []string, error) {
	vals := registry.Values{}
	var dirs []string
	var errs []error
	for k, v := range raw {
		o := t.Option(k)
		if o == nil {
			errs = append(errs, fmt.Errorf("layer type %s has no option %q", t.Name, k))
			continue
		}
		cv, err := o.Convert(v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		vals[k] = cv
	}
	for _, o := range t.Options {
		if _, ok := vals[o.Name]; ok {
			if o.Kind == registry.Dir {
				d := vals.String(o.Name)
				if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
					errs = append(errs, fmt.Errorf("option %q: directory %s does not exist", o.Name, d))
				}
				dirs = append(dirs, d)
			}
			continue
		}
		if o.Required {
			errs = append(errs, fmt.Errorf("missing option %q (%s)", o.Name, o.Help))
		} else if o.Default != nil {
			vals[o.Name] = o.Default
		}
	}
	return vals, dirs, errors.Join(errs...)
}

func typeNames() string {
	var n []string
	for _, t := range registry.Types() {
		n = append(n, t.Name)
	}
	sort.Strings(n)
	return strings.Join(n, ", ")
}

func lowersWanted(t *registry.Type) string {
	switch {
	case t.MaxLowers == 0:
		return "none (it is a bottom layer)"
	case t.MinLowers == t.MaxLowers:
		return fmt.Sprintf("exactly %d", t.MinLowers)
	case t.MaxLowers < 0:
		return fmt.Sprintf("at least %d", t.MinLowers)
	}
	return fmt.Sprintf("%d to %d", t.MinLowers, t.MaxLowers)
}
