package codec

import (
	"errors"
	"sync"

	"github.com/pierrec/lz4/v4"
)

// lz4Codec is LZ4's block format, one block per chunk; level 0 is the fast
// compressor, 1-9 the high-compression one.
type lz4Codec struct {
	level int
	c     sync.Pool // *lz4.Compressor
}

func newLz4(level int) (Codec, error) { return &lz4Codec{level: level}, nil }

func (l *lz4Codec) Encode(dst, src []byte) ([]byte, error) {
	start := len(dst)
	dst = append(dst, make([]byte, lz4.CompressBlockBound(len(src)))...)
	var n int
	var err error
	if l.level > 0 {
		hc := lz4.CompressorHC{Level: lz4.CompressionLevel(1 << (8 + l.level))}
		n, err = hc.CompressBlock(src, dst[start:])
	} else {
		c, _ := l.c.Get().(*lz4.Compressor)
		if c == nil {
			c = new(lz4.Compressor)
		}
		n, err = c.CompressBlock(src, dst[start:])
		l.c.Put(c)
	}
	if err != nil {
		return nil, err
	}
	if n == 0 && len(src) > 0 { // incompressible: the engine stores it raw
		return append(dst[:start], src...), nil
	}
	return dst[:start+n], nil
}

var errLz4 = errors.New("lz4: corrupt data")

func (l *lz4Codec) Decode(dst, src []byte, n int) ([]byte, error) {
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	k, err := lz4.UncompressBlock(src, dst[start:])
	if err != nil || k != n {
		return nil, errLz4
	}
	return dst, nil
}

func init() {
	Register(&Kind{ID: 5, Name: "lz4", Shrinks: true, Summary: "compresses data with LZ4 (fast), chunk by chunk",
		HasLevel: true, MinLevel: 0, MaxLevel: 9, DefaultLevel: 0, New: newLz4})
}
