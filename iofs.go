package cairn

import (
	"io/fs"
	"os"

	"cairnfs.dev/cairn/layer"
)

// FS is the stack as an io/fs.FS, read-only: fs.ReadDirFS, fs.ReadFileFS,
// fs.StatFS, fs.SubFS and fs.ReadLinkFS, for fs.WalkDir,
// http.FileServerFS, template.ParseFS, testing/fstest and the like. Its
// files are *File.
func (s *Stack) FS() fs.FS { return &iofs{s: s} }

type iofs struct {
	s   *Stack
	dir string // a sub-tree (Sub): the prefix of every name
}

var (
	_ fs.ReadDirFS  = (*iofs)(nil)
	_ fs.ReadFileFS = (*iofs)(nil)
	_ fs.StatFS     = (*iofs)(nil)
	_ fs.SubFS      = (*iofs)(nil)
	_ fs.ReadLinkFS = (*iofs)(nil)
)

// name checks name as io/fs wants it and gives the stack's name for it.
func (f *iofs) name(op, name string) (string, error) {
	if !fs.ValidPath(name) {
		return "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	if f.dir == "" {
		return name, nil
	}
	if name == "." {
		return f.dir, nil
	}
	return f.dir + "/" + name, nil
}

// rename gives an error the name the caller used.
func rename(err error, name string) error {
	if pe, ok := err.(*fs.PathError); ok {
		pe.Path = name
	}
	return err
}

func (f *iofs) Open(name string) (fs.File, error) {
	n, err := f.name("open", name)
	if err != nil {
		return nil, err
	}
	file, err := f.s.OpenFile(n, os.O_RDONLY, 0)
	if err != nil {
		return nil, rename(err, name)
	}
	file.name = name
	return file, nil
}

func (f *iofs) ReadDir(name string) ([]fs.DirEntry, error) {
	n, err := f.name("readdir", name)
	if err != nil {
		return nil, err
	}
	ents, err := f.s.ReadDir(n)
	return ents, rename(err, name)
}

func (f *iofs) ReadFile(name string) ([]byte, error) {
	n, err := f.name("readfile", name)
	if err != nil {
		return nil, err
	}
	b, err := f.s.ReadFile(n)
	return b, rename(err, name)
}

func (f *iofs) Stat(name string) (fs.FileInfo, error) {
	n, err := f.name("stat", name)
	if err != nil {
		return nil, err
	}
	fi, err := f.s.Stat(n)
	if err == nil && name == "." {
		fi = newInfo(".", *fi.Sys().(*layer.Attr))
	}
	return fi, rename(err, name)
}

func (f *iofs) Lstat(name string) (fs.FileInfo, error) {
	n, err := f.name("lstat", name)
	if err != nil {
		return nil, err
	}
	fi, err := f.s.Lstat(n)
	return fi, rename(err, name)
}

func (f *iofs) ReadLink(name string) (string, error) {
	n, err := f.name("readlink", name)
	if err != nil {
		return "", err
	}
	t, err := f.s.Readlink(n)
	return t, rename(err, name)
}

func (f *iofs) Sub(dir string) (fs.FS, error) {
	n, err := f.name("sub", dir)
	if err != nil {
		return nil, err
	}
	if n == "." {
		return f, nil
	}
	return &iofs{s: f.s, dir: n}, nil
}
