package spec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

// Stack is a built stack.
type Stack struct {
	Top    layer.FS
	Layers map[string]layer.FS
	// Dirs are the local directories the stack keeps its data in.
	Dirs []string
}

// Close closes every layer of the stack.
func (st *Stack) Close() error { return layer.CloseStack(st.Top) }

// Build constructs the layers, bottom first. The spec must have parsed
// without errors.
func (s *Spec) Build() (*Stack, error) {
	st := &Stack{Layers: map[string]layer.FS{}}
	building := map[string]bool{}
	var build func(name string) (layer.FS, error)
	build = func(name string) (layer.FS, error) {
		if fs, ok := st.Layers[name]; ok {
			return fs, nil
		}
		l, ok := s.Layers[name]
		if !ok {
			return nil, fmt.Errorf("%s: layer %q is not defined", s.File, name)
		}
		if building[name] {
			return nil, &Error{Pos: l.Pos, Msg: fmt.Sprintf("layer %q stacks over itself (a cycle)", name)}
		}
		building[name] = true
		if l.t == nil || l.Values == nil {
			return nil, &Error{Pos: l.Pos, Msg: fmt.Sprintf("layer %q has errors: run cairn check", name)}
		}
		var lowers []layer.FS
		for _, o := range l.Over {
			fs, err := build(o)
			if err != nil {
				return nil, err
			}
			lowers = append(lowers, fs)
		}
		fs, err := l.t.New(lowers, l.Values)
		if err != nil {
			return nil, &Error{Pos: l.Pos, Msg: fmt.Sprintf("layer %q (type %s): %v", name, l.t.Name, err), Err: err}
		}
		for _, o := range l.t.Options {
			if o.Kind == registry.Dir {
				if d := l.Values.String(o.Name); d != "" {
					st.Dirs = append(st.Dirs, d)
				}
			}
		}
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

// CheckMountpoint reports a mountpoint the stack cannot be mounted on: one
// inside (or equal to) a directory a layer keeps its data in, or one that
// holds a file a layer writes (such as a log): the stack would then serve
// itself and hang.
func (s *Spec) CheckMountpoint(mountpoint string) error {
	mp, err := realPath(mountpoint)
	if err != nil {
		return nil // the caller reports a missing mountpoint
	}
	var errs ErrorList
	for _, name := range s.Order {
		l := s.Layers[name]
		if l.t == nil || l.Values == nil {
			continue
		}
		for _, o := range l.t.Options {
			if o.Kind != registry.Dir && o.Kind != registry.Path {
				continue
			}
			p := l.Values.String(o.Name)
			if p == "" {
				continue
			}
			rp, err := realPath(p)
			if err != nil {
				rp = filepath.Clean(p)
			}
			pos := l.OptPos[o.Name]
			if pos.Line == 0 {
				pos = l.Pos
			}
			switch {
			case o.Kind == registry.Dir && within(mp, rp):
				errs = append(errs, &Error{Pos: pos, Msg: fmt.Sprintf("the mountpoint %s is inside the lower directory %s of layer %q (option %s): the stack would serve itself; mount it elsewhere", mountpoint, p, name, o.Name)})
			case o.Kind == registry.Path && within(rp, mp):
				errs = append(errs, &Error{Pos: pos, Msg: fmt.Sprintf("the file %s of layer %q (option %s) is inside the mountpoint %s: the stack would write into itself; put it elsewhere", p, name, o.Name, mountpoint)})
			}
		}
	}
	errs.fillLines(s.File, s.text)
	return errs.err()
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	return path == dir || dir == "/" || strings.HasPrefix(path, dir+"/")
}

func realPath(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	r, err := filepath.EvalSymlinks(abs)
	if err != nil {
		// A file not yet created: resolve its directory.
		if dr, err2 := filepath.EvalSymlinks(filepath.Dir(abs)); err2 == nil {
			return filepath.Join(dr, filepath.Base(abs)), nil
		}
		return "", err
	}
	return r, nil
}

// Values validates raw options against a layer type and fills defaults. It
// also returns the values of Dir options. (Parse does this for a spec; this
// is for callers that build one layer by hand.)
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
