package codec

import (
	"bytes"
	"errors"
	"io"
	"sync"

	"github.com/klauspost/compress/flate"
)

// gzipCodec is deflate (RFC 1951), as gzip uses it, one stream per chunk.
type gzipCodec struct {
	level int
	w     sync.Pool // *flate.Writer
	r     sync.Pool // io.ReadCloser with flate.Resetter
}

func newGzip(level int) (Codec, error) {
	if _, err := flate.NewWriter(io.Discard, level); err != nil {
		return nil, err
	}
	return &gzipCodec{level: level}, nil
}

func (g *gzipCodec) Encode(dst, src []byte) ([]byte, error) {
	buf := bytes.NewBuffer(dst)
	w, _ := g.w.Get().(*flate.Writer)
	if w == nil {
		w, _ = flate.NewWriter(buf, g.level)
	} else {
		w.Reset(buf)
	}
	defer g.w.Put(w)
	if _, err := w.Write(src); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

var errDeflate = errors.New("deflate: corrupt data")

func (g *gzipCodec) Decode(dst, src []byte, n int) ([]byte, error) {
	br := bytes.NewReader(src)
	r, _ := g.r.Get().(io.ReadCloser)
	if r == nil {
		r = flate.NewReader(br)
	} else if err := r.(flate.Resetter).Reset(br, nil); err != nil {
		return nil, err
	}
	defer g.r.Put(r)
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	if _, err := io.ReadFull(r, dst[start:]); err != nil {
		return nil, errDeflate
	}
	var one [1]byte
	if k, err := r.Read(one[:]); k != 0 || err != io.EOF {
		return nil, errDeflate
	}
	if br.Len() != 0 {
		return nil, errDeflate
	}
	return dst, nil
}

func init() {
	Register(&Kind{ID: 3, Name: "gzip", Shrinks: true, Summary: "compresses data with deflate (gzip's algorithm), chunk by chunk",
		HasLevel: true, MinLevel: 1, MaxLevel: 9, DefaultLevel: 6, New: newGzip})
}
