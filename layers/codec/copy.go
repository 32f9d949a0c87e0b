package codec

import "errors"

// copyCodec stores bytes as they are: it exercises the engine alone (the
// seed's Copyfs).
type copyCodec struct{}

func (copyCodec) Encode(dst, src []byte) ([]byte, error) { return append(dst, src...), nil }

func (copyCodec) Decode(dst, src []byte, n int) ([]byte, error) {
	if len(src) != n {
		return nil, errors.New("copy: length mismatch")
	}
	return append(dst, src...), nil
}

func init() {
	Register(&Kind{ID: 1, Name: "copy", Summary: "stores data unchanged through the size-changing engine (measures its cost)",
		New: func(int) (Codec, error) { return copyCodec{}, nil }})
}
