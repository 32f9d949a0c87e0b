package spec

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"cairnfs.dev/cairn/registry"
)

// Masked stands for a secret option's value in explain and --toml output.
const Masked = "********"

// TOML prints the spec as a spec file: mount options, then the layers from
// the mounted one down, then the rules. Only the options the spec sets are
// printed. Secret values are masked unless reveal is set.
func (s *Spec) TOML(reveal bool) string {
	var b strings.Builder
	if s.Inline != "" {
		b.WriteString("# cairn stack spec, from the inline form\n")
	}
	fmt.Fprintf(&b, "mount = %s\n", tomlQuote(s.Mount))
	for _, k := range s.Given {
		fmt.Fprintf(&b, "%s = %s\n", k, s.mountOption(k))
	}
	for _, name := range s.TopDown() {
		l := s.Layers[name]
		fmt.Fprintf(&b, "\n[layer.%s]\ntype = %s\n", name, tomlQuote(l.Type))
		switch len(l.Over) {
		case 0:
		case 1:
			fmt.Fprintf(&b, "over = %s\n", tomlQuote(l.Over[0]))
		default:
			fmt.Fprintf(&b, "over = %s\n", tomlList(l.Over))
		}
		writeOptions(&b, l.t, optionList(l.t), l.Options, l.Values, reveal)
	}
	for _, r := range s.Rules {
		fmt.Fprintf(&b, "\n[[rule]]\nlayer = %s\n", tomlQuote(r.Layer))
		fmt.Fprintf(&b, "match = %s\n", tomlList(r.Match))
		if len(r.Except) > 0 {
			fmt.Fprintf(&b, "except = %s\n", tomlList(r.Except))
		}
		var t *registry.Type
		var opts []registry.Option
		if l := s.Layers[r.Layer]; l != nil && l.t != nil && l.t.Rules != nil {
			t, opts = l.t, l.t.Rules.Options
		}
		writeOptions(&b, t, opts, r.Options, r.Values, reveal)
	}
	return b.String()
}

func optionList(t *registry.Type) []registry.Option {
	if t == nil {
		return nil
	}
	return t.Options
}

// writeOptions prints the options that were given, in the type's order
// (unknown ones, when the type is unknown, in name order).
func writeOptions(b *strings.Builder, t *registry.Type, opts []registry.Option, raw map[string]any, vals registry.Values, reveal bool) {
	if t == nil {
		for _, k := range sortedKeys(raw) {
			fmt.Fprintf(b, "%s = %s\n", tomlKey(k), tomlAny(raw[k]))
		}
		return
	}
	for i := range opts {
		o := &opts[i]
		rv, ok := raw[o.Name]
		if !ok {
			continue
		}
		fmt.Fprintf(b, "%s = %s\n", o.Name, FormatValue(o, rv, vals[o.Name], reveal))
	}
}

// FormatValue prints an option's value as TOML: typed (from vals) where it
// was validated, as written otherwise. Sizes and durations keep the text they
// were written with ("64KiB", "90s").
func FormatValue(o *registry.Option, raw, typed any, reveal bool) string {
	if o.Secret && !reveal {
		return tomlQuote(Masked)
	}
	if typed == nil {
		return tomlAny(raw)
	}
	switch o.Kind {
	case registry.Size, registry.Duration:
		if s, ok := raw.(string); ok {
			return tomlQuote(s)
		}
	}
	return tomlAny(typed)
}

func (s *Spec) mountOption(k string) string {
	switch k {
	case "allow_other":
		return strconv.FormatBool(s.AllowOther)
	case "xattr":
		return strconv.FormatBool(!s.NoXattr)
	case "writeback":
		return strconv.FormatBool(s.Writeback)
	case "entry_timeout":
		return timeoutText(s.EntryTimeout)
	case "attr_timeout":
		return timeoutText(s.AttrTimeout)
	case "negative_timeout":
		return timeoutText(s.NegativeTimeout)
	case "log_level":
		return tomlQuote(s.LogLevel)
	}
	return `""`
}

func timeoutText(d time.Duration) string {
	if d < 0 {
		return tomlQuote("0s")
	}
	return tomlQuote(d.String())
}

// TopDown lists the layers from the mounted one down (depth first, lowers in
// order), then any others in the order they are defined.
func (s *Spec) TopDown() []string {
	var out []string
	seen := map[string]bool{}
	var walk func(string)
	walk = func(n string) {
		l := s.Layers[n]
		if l == nil || seen[n] {
			return
		}
		seen[n] = true
		out = append(out, n)
		for _, o := range l.Over {
			walk(o)
		}
	}
	walk(s.Mount)
	for _, n := range s.Order {
		walk(n)
	}
	return out
}

func tomlAny(v any) string {
	switch x := v.(type) {
	case string:
		return tomlQuote(x)
	case bool:
		return strconv.FormatBool(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case int:
		return strconv.Itoa(x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case time.Duration:
		return tomlQuote(x.String())
	case []string:
		return tomlList(x)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = tomlAny(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		var parts []string
		for _, k := range sortedKeys(x) {
			parts = append(parts, tomlKey(k)+" = "+tomlAny(x[k]))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return tomlQuote(fmt.Sprint(v))
}

func tomlList(l []string) string {
	parts := make([]string, len(l))
	for i, e := range l {
		parts[i] = tomlQuote(e)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func tomlKey(k string) string {
	if k != "" && nameRE.MatchString(k) {
		return k
	}
	return tomlQuote(k)
}

// tomlQuote writes a TOML basic string.
func tomlQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\t':
			b.WriteString(`\t`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if r < 0x20 || r == 0x7f {
				fmt.Fprintf(&b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
