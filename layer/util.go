package layer

import (
	"context"
	"errors"
	"io"
	"syscall"

	"golang.org/x/sys/unix"
)

// ReadFile reads a whole file of fs (in-process use).
func ReadFile(ctx context.Context, fs FS, path string) ([]byte, error) {
	f, err := fs.Open(ctx, path, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Release(ctx)
	var out []byte
	buf := make([]byte, 128<<10)
	for {
		n, err := f.ReadAt(ctx, buf, int64(len(out)))
		out = append(out, buf[:n]...)
		if err == io.EOF || (err == nil && n == 0) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// WriteFile creates or truncates path and writes data to it.
func WriteFile(ctx context.Context, fs FS, path string, data []byte, mode uint32) error {
	f, _, err := fs.Create(ctx, path, unix.O_WRONLY|unix.O_TRUNC, mode)
	if errors.Is(err, syscall.EEXIST) {
		f, err = fs.Open(ctx, path, unix.O_WRONLY|unix.O_TRUNC)
	}
	if err != nil {
		return err
	}
	for off := 0; off < len(data); {
		n, err := f.WriteAt(ctx, data[off:], int64(off))
		if err != nil {
			f.Release(ctx)
			return err
		}
		off += n
	}
	if err := f.Flush(ctx); err != nil {
		f.Release(ctx)
		return err
	}
	return f.Release(ctx)
}

// MkdirAll creates path and its missing parents.
func MkdirAll(ctx context.Context, fs FS, path string, mode uint32) error {
	if path == "" {
		return nil
	}
	a, err := fs.Getattr(ctx, path)
	if err == nil {
		if !a.IsDir() {
			return syscall.ENOTDIR
		}
		return nil
	}
	dir, _ := Split(path)
	if err := MkdirAll(ctx, fs, dir, mode); err != nil {
		return err
	}
	if _, err := fs.Mkdir(ctx, path, mode); err != nil && !errors.Is(err, syscall.EEXIST) {
		return err
	}
	return nil
}
