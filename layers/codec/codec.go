// Package codec is the Fast Indexing engine for size-changing layers, and
// its codecs: copy, uuencode, gzip (deflate), zstd and lz4. Each codec is a
// layer type of its own.
//
// A file is stored as independently decodable chunks in a log of
// self-describing records (docs/codec-format.md): a read decodes only the
// chunks it touches, a write appends new records for the chunks it changes
// (its cost does not grow with the file), small appends and small writes
// into stored chunks are kept unencoded as deltas over their chunk, within
// limits, until the file is left alone (fast tails, folded at rest), and a
// lost index is rebuilt from the records. The engine is a layer.Transform (Engine): a codec layer is the
// engine applied to every file (layer.Transformed), and a chain can apply
// it to one file.
package codec

import (
	"fmt"
	"sync"
)

// Codec encodes and decodes one chunk. It must be safe for concurrent use.
type Codec interface {
	// Encode appends the encoding of src to dst.
	Encode(dst, src []byte) ([]byte, error)
	// Decode appends the decoding of src to dst. n is the decoded length
	// the chunk's record states: a decoding of another length, or of
	// more than n bytes, is an error (corrupt data).
	Decode(dst, src []byte, n int) ([]byte, error)
}

// Kind describes a codec: its on-disk identifier and how to make one.
type Kind struct {
	ID   uint8  // stored in every record; never reuse one
	Name string // the layer type
	// Shrinks: the codec compresses, so a chunk whose encoding is not
	// smaller is stored raw instead.
	Shrinks bool
	// Levels, if set, is the accepted range of the level option and its
	// default.
	MinLevel, MaxLevel, DefaultLevel int
	HasLevel                         bool
	// DefaultChunk is the default chunk size (0: DefaultChunkSize).
	DefaultChunk int64
	Summary      string
	New          func(level int) (Codec, error)
}

var (
	kindsMu sync.Mutex
	kinds   = map[uint8]*Kind{}
	// decoders holds one codec per ID for reading records of any codec.
	decoders sync.Map // uint8 -> Codec
)

func addKind(k *Kind) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	if _, dup := kinds[k.ID]; dup {
		panic(fmt.Sprintf("codec: ID %d registered twice", k.ID))
	}
	kinds[k.ID] = k
}

// decoder returns a codec that can decode records written with id.
func decoder(id uint8) (Codec, error) {
	if c, ok := decoders.Load(id); ok {
		return c.(Codec), nil
	}
	kindsMu.Lock()
	k := kinds[id]
	kindsMu.Unlock()
	if k == nil {
		return nil, fmt.Errorf("unknown codec id %d", id)
	}
	c, err := k.New(k.DefaultLevel)
	if err != nil {
		return nil, err
	}
	c2, _ := decoders.LoadOrStore(id, c)
	return c2.(Codec), nil
}
