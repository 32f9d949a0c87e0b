package spec

import (
	"fmt"
	"io"
	"strings"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

// Default kernel cache times, as the FUSE frontend applies them when the spec
// and the command line say nothing.
const defaultTimeout = "1s"

// Explain prints the stack as a tree, the mounted layer first: each layer's
// type, what it changes, whether files under it can get kernel passthrough,
// its options (secrets masked, defaults marked) and its rules.
func (s *Spec) Explain(w io.Writer) {
	src := s.File
	if s.Inline != "" {
		src = "the inline spec" // not its text: it may hold a secret
	}
	n := fmt.Sprintf("%d layers", len(s.Layers))
	if len(s.Layers) == 1 {
		n = "1 layer"
	}
	fmt.Fprintf(w, "%s mounts layer %q (%s)\n", src, s.Mount, n)
	who, keep := s.dataChangers(s.Mount), s.keepers(s.Mount)
	switch {
	case s.Writeback:
		fmt.Fprintf(w, "kernel passthrough: no: writeback = true: the kernel passes no file through on a mount with its writeback cache (Linux 6.10 on); the daemon serves every file's reads and writes, through the kernel's page cache\n")
	case len(who) == 0 && len(keep) == 0:
		fmt.Fprintf(w, "kernel passthrough: yes: no layer changes file data, so the kernel reads and writes the lower files itself\n")
	case len(keep) == 0 && s.allPerFile(who):
		fmt.Fprintf(w, "kernel passthrough: partly: %s the data of some files (each file decides); the others are passed through\n", changersText(who))
	case s.clearPath(s.Mount):
		fmt.Fprintf(w, "kernel passthrough: partly: %s; the files of the paths without it are passed through (each file decides)\n", whyNot(who, keep))
	default:
		fmt.Fprintf(w, "kernel passthrough: no: %s\n", whyNot(who, keep))
	}
	if lacks := s.lacks(s.Mount); lacks.caps != 0 {
		fmt.Fprintf(w, "cannot: %s (%s); the mount answers EPERM, EINVAL or EOPNOTSUPP\n", lacks.caps, strings.Join(lacks.who, ", "))
	}
	// Every lower today is a directory of this machine: the kernel keeps
	// the mount's locks (fusefs does not ask FUSE to forward them).
	fmt.Fprintf(w, "locks: local: the kernel keeps POSIX, OFD and flock locks for the mount's processes; they do not reach the lower files\n")
	if who := s.cannotFind(s.Mount); len(who) == 0 {
		fmt.Fprintf(w, "file handles: yes: open_by_handle_at and NFS exports reach objects wherever they moved, after the kernel forgot them (see docs/posix.md)\n")
	} else {
		fmt.Fprintf(w, "file handles: no: %s cannot find objects by identity; a handle goes stale (ESTALE) once the kernel has forgotten its object\n", andList(who))
	}
	var mo []string
	for _, k := range mountOptions {
		v := s.mountOption(k)
		if !contains(s.Given, k) {
			switch k {
			case "allow_other", "writeback":
				v = "false"
			case "xattr":
				v = "true"
			case "log_level":
				v = `"info"`
			default:
				v = fmt.Sprintf("%q", defaultTimeout)
			}
			v += " (default)"
		}
		mo = append(mo, k+" = "+v)
	}
	fmt.Fprintf(w, "mount options: %s\n\n", strings.Join(mo, ", "))
	e := &explainer{w: w, seen: map[string]bool{}, all: who, keep: keep}
	s.explainLayer(e, s.Mount, "", true, true, nil, nil)
}

// whyNot says why files are not passed through: the layers that change
// their data (who) and those that keep them from the kernel (keep).
func whyNot(who, keep []string) string {
	var parts []string
	if len(who) > 0 {
		parts = append(parts, changersText(who)+" file data")
	}
	if len(keep) == 1 {
		parts = append(parts, "layer "+keep[0])
	} else if len(keep) > 1 {
		parts = append(parts, "layers "+andList(keep))
	}
	return strings.Join(parts, "; ")
}

// keepers lists the layers at or below name that change no data but keep
// their files from the kernel all the same (registry.Type.NoPassthrough,
// from the parsed options and rules), as `"name" (type) keeps its files
// from the kernel: why`.
func (s *Spec) keepers(name string) []string {
	var out []string
	s.below(name, func(n string, l *Layer) bool {
		if why := s.keeps(l); why != "" {
			out = append(out, fmt.Sprintf("%q (%s) keeps its files from the kernel: %s", n, l.Type, why))
		}
		return true
	})
	return out
}

// below calls visit for each layer at or below name, once each, top down;
// visit says whether to go on below the layer.
func (s *Spec) below(name string, visit func(n string, l *Layer) bool) {
	seen := map[string]bool{}
	var walk func(string)
	walk = func(n string) {
		l := s.Layers[n]
		if l == nil || seen[n] {
			return
		}
		seen[n] = true
		if !visit(n, l) {
			return
		}
		for _, o := range l.Over {
			walk(o)
		}
	}
	walk(name)
}

// keeps is why l keeps its files from the kernel though it changes no
// data ("" if it does not).
func (s *Spec) keeps(l *Layer) string {
	if l.t == nil || l.t.NoPassthrough == nil || l.Values == nil || l.t.Changes&layer.ChangesData != 0 {
		return ""
	}
	return l.t.NoPassthrough(l.Values)
}

func changersText(who []string) string {
	if len(who) == 1 {
		return fmt.Sprintf("layer %s changes", who[0])
	}
	return fmt.Sprintf("layers %s change", andList(who))
}

// dataChangers lists the layers at or below name that change data, as
// `"name" (type)`.
func (s *Spec) dataChangers(name string) []string {
	var out []string
	s.below(name, func(n string, l *Layer) bool {
		if l.t != nil && l.t.Changes&layer.ChangesData != 0 {
			out = append(out, fmt.Sprintf("%q (%s)", n, l.Type))
		}
		return true
	})
	return out
}

// allPerFile reports whether every layer of who (as dataChangers names
// them) changes data per file (registry.Type.PerFile).
func (s *Spec) allPerFile(who []string) bool {
	per := map[string]bool{}
	for n, l := range s.Layers {
		if l.t != nil && l.t.PerFile {
			per[fmt.Sprintf("%q (%s)", n, l.Type)] = true
		}
	}
	for _, w := range who {
		if !per[w] {
			return false
		}
	}
	return true
}

// clearPath reports whether some path from name down to a bottom layer
// has no layer that changes data: its files can be passed through.
func (s *Spec) clearPath(name string) bool {
	l := s.Layers[name]
	if l == nil || l.t == nil || l.t.Changes&layer.ChangesData != 0 && !l.t.PerFile || s.keeps(l) != "" {
		return false
	}
	if len(l.Over) == 0 {
		return true
	}
	for _, o := range l.Over {
		if s.clearPath(o) {
			return true
		}
	}
	return false
}

// cannotFind lists the layers at or below name that keep file handles from
// working (see layer.Finder): a bottom layer or a layer that changes names
// or placement, or that has several lowers, and does not find by identity.
func (s *Spec) cannotFind(name string) []string {
	var out []string
	s.below(name, func(n string, l *Layer) bool {
		if l.t == nil {
			return false
		}
		if !l.t.Finds && (len(l.Over) != 1 || l.t.Changes&(layer.ChangesNames|layer.ChangesPlacement) != 0) {
			out = append(out, fmt.Sprintf("layer %q (%s)", n, l.Type))
			return false
		}
		return true
	})
	return out
}

// lacks is what the stack under name cannot do (the union of its types'
// Lacks: masks and fan-out intersections both keep a lack), and the layers
// that lack it.
func (s *Spec) lacks(name string) (r struct {
	caps layer.FSCaps
	who  []string
}) {
	s.below(name, func(n string, l *Layer) bool {
		if l.t != nil && l.t.Lacks != 0 {
			r.caps |= l.t.Lacks
			r.who = append(r.who, fmt.Sprintf("%q (%s)", n, l.Type))
		}
		return true
	})
	return
}

type explainer struct {
	w    io.Writer
	seen map[string]bool
	all  []string // the layers of the stack that change data
	keep []string // those that keep their files from the kernel all the same
}

// explainLayer prints name and the layers under it. above lists the layers
// over it that change data, aboveKeep those that keep their files from the
// kernel.
func (s *Spec) explainLayer(e *explainer, name, prefix string, last, root bool, above, aboveKeep []string) {
	w, seen := e.w, e.seen
	l := s.Layers[name]
	head, body := prefix, prefix
	if !root {
		if last {
			head, body = prefix+"└── ", prefix+"    "
		} else {
			head, body = prefix+"├── ", prefix+"│   "
		}
	}
	if l == nil {
		fmt.Fprintf(w, "%s%s (not defined)\n", head, name)
		return
	}
	if seen[name] {
		fmt.Fprintf(w, "%s%s (%s, shown above)\n", head, name, l.Type)
		return
	}
	seen[name] = true
	fmt.Fprintf(w, "%s%s (%s)\n", head, name, l.Type)
	detail := body + "│   "
	if len(l.Over) == 0 {
		detail = body + "    "
	}
	line := func(f string, a ...any) { fmt.Fprintf(w, "%s%s\n", detail, fmt.Sprintf(f, a...)) }
	t := l.t
	if t == nil {
		line("unknown type")
	} else {
		line("%s", t.Summary)
		line("changes: %s", t.Changes)
		onPath := append(append([]string{}, above...), s.dataChangers(name)...)
		keepOnPath := append(append([]string{}, aboveKeep...), s.keepers(name)...)
		switch {
		case len(e.all) == 0 && len(e.keep) == 0:
			line("passthrough: yes")
		case len(keepOnPath) == 0 && len(onPath) > 0 && s.allPerFile(onPath):
			line("passthrough: per file (%s the data of some files; the others are passed through)", changersText(onPath))
		case len(keepOnPath) > 0:
			line("passthrough: no (%s)", whyNot(onPath, keepOnPath))
		case len(onPath) > 0:
			line("passthrough: no (%s data)", changersText(onPath))
		default:
			// Passthrough is decided per file (layer.Caps): files on this
			// path get it though other paths change data.
			line("passthrough: yes (no layer on this path changes data)")
		}
		for i := range t.Options {
			o := &t.Options[i]
			raw, given := l.Options[o.Name]
			typed := l.Values[o.Name]
			switch {
			case given:
				line("%s = %s", o.Name, FormatValue(o, raw, typed, false))
			case typed != nil:
				line("%s = %s (default)", o.Name, FormatValue(o, o.Default, typed, false))
			}
		}
		if t.Explain != nil {
			for _, x := range t.Explain(l.Values, l.Over) {
				line("%s", x)
			}
		}
	}
	for _, r := range l.Rules {
		line("%s", r.describe(t, indexOfRule(s.Rules, r)+1))
	}
	if len(l.Rules) > 0 {
		if t != nil && t.Rules != nil && t.Rules.Help != "" {
			line("(%s)", t.Rules.Help)
		} else {
			line("(rules are tried in order; the first that covers a path applies)")
		}
	}
	if t != nil && t.Changes&layer.ChangesData != 0 {
		above = append(append([]string{}, above...), fmt.Sprintf("%q (%s)", name, l.Type))
	}
	if why := s.keeps(l); why != "" {
		aboveKeep = append(append([]string{}, aboveKeep...), fmt.Sprintf("%q (%s) keeps its files from the kernel: %s", name, l.Type, why))
	}
	for i, o := range l.Over {
		s.explainLayer(e, o, body, i == len(l.Over)-1, false, above, aboveKeep)
	}
}

// describe is a rule on one line.
func (r *Rule) describe(t *registry.Type, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rule %d: match %s", n, strings.Join(quoted(r.Match), ", "))
	if len(r.Except) > 0 {
		fmt.Fprintf(&b, " except %s", strings.Join(quoted(r.Except), ", "))
	}
	if t != nil && t.Rules != nil {
		var parts []string
		for i := range t.Rules.Options {
			o := &t.Rules.Options[i]
			raw, given := r.Options[o.Name]
			typed := r.Values[o.Name]
			switch {
			case given:
				parts = append(parts, o.Name+" = "+FormatValue(o, raw, typed, false))
			case typed != nil:
				parts = append(parts, o.Name+" = "+FormatValue(o, o.Default, typed, false)+" (default)")
			}
		}
		if len(parts) > 0 {
			b.WriteString(": " + strings.Join(parts, ", "))
		}
	}
	return b.String()
}

func quoted(l []string) []string {
	out := make([]string, len(l))
	for i, s := range l {
		out[i] = tomlQuote(s)
	}
	return out
}

func indexOfRule(rules []*Rule, r *Rule) int {
	for i, x := range rules {
		if x == r {
			return i
		}
	}
	return -1
}
