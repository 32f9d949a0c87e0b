package pathmatch

import "strings"

// SameBelow reports whether the set cannot tell a from b: a and b, and
// every a/s and b/s below them, are in the set alike. It is exact in one
// direction only: true means the same answers everywhere below; false may
// be said of paths that happen to be treated alike. A layer that applies
// rules per path uses it to let a rename or a hard link keep the rules that
// cover a file (acl).
func (s *Set) SameBelow(a, b string) bool {
	if s == nil {
		return true
	}
	for _, l := range [][]*Pattern{s.Match, s.Except} {
		for _, p := range l {
			if !p.SameBelow(a, b) {
				return false
			}
		}
	}
	return true
}

// SameBelow reports whether the pattern matches a and b, and every a/s and
// b/s, alike (see Set.SameBelow).
func (p *Pattern) SameBelow(a, b string) bool {
	na, nb := split(a), split(b)
	for i := range p.alts {
		e := p.alts[i].anchored()
		sa, sb := states(e, na), states(e, nb)
		for j := range sa {
			if sa[j] != sb[j] {
				return false
			}
		}
	}
	return true
}

func split(path string) []string {
	path = strings.Trim(path, "/")
	if path == "" {
		return nil
	}
	return strings.Split(path, "/")
}

// anchored returns the alternative as elements matched from the root: a
// pattern for any depth gets a leading "**", a subtree pattern a trailing
// one.
func (a *alt) anchored() []elem {
	var e []elem
	if a.anyDepth {
		e = append(e, elem{deep: true})
	}
	e = append(e, a.elems...)
	if a.subtree {
		e = append(e, elem{deep: true})
	}
	return e
}

// states runs the elements as an automaton over names: st[i] says that
// e[:i] can match all of names. The path matches when st[len(e)] is set,
// and what matches below the path depends on st only.
func states(e []elem, names []string) []bool {
	st := make([]bool, len(e)+1)
	st[0] = true
	closure(e, st)
	for _, n := range names {
		next := make([]bool, len(e)+1)
		for i := 0; i < len(e); i++ {
			switch {
			case !st[i]:
			case e[i].deep:
				next[i] = true
			case matchName(e[i].toks, n):
				next[i+1] = true
			}
		}
		closure(e, next)
		st = next
	}
	return st
}

// closure: "**" may match no element.
func closure(e []elem, st []bool) {
	for i := 0; i < len(e); i++ {
		if st[i] && e[i].deep {
			st[i+1] = true
		}
	}
}
