package codec

import (
	"errors"
)

// uuCodec is uuencode's body format: lines of up to 45 bytes, each a length
// character, 4 characters per 3 bytes (6 bits each, offset from the space
// character, with ` for 0) and a newline. It grows data by about 37%.
type uuCodec struct{}

func uuChar(v byte) byte {
	if v == 0 {
		return '`'
	}
	return v + ' '
}

func uuVal(c byte) (byte, bool) {
	if c == '`' {
		return 0, true
	}
	if c < ' ' || c > ' '+63 {
		return 0, false
	}
	return (c - ' ') & 63, true
}

func (uuCodec) Encode(dst, src []byte) ([]byte, error) {
	for len(src) > 0 {
		n := min(len(src), 45)
		line := src[:n]
		src = src[n:]
		dst = append(dst, uuChar(byte(n)))
		for i := 0; i < n; i += 3 {
			var b [3]byte
			copy(b[:], line[i:])
			dst = append(dst, uuChar(b[0]>>2), uuChar((b[0]<<4|b[1]>>4)&63),
				uuChar((b[1]<<2|b[2]>>6)&63), uuChar(b[2]&63))
		}
		dst = append(dst, '\n')
	}
	return dst, nil
}

var errUU = errors.New("uuencode: corrupt data")

func (uuCodec) Decode(dst, src []byte, n int) ([]byte, error) {
	start := len(dst)
	for len(src) > 0 {
		ln, ok := uuVal(src[0])
		if !ok || ln == 0 || ln > 45 {
			return nil, errUU
		}
		enc := (int(ln) + 2) / 3 * 4
		if len(src) < 1+enc+1 || src[1+enc] != '\n' {
			return nil, errUU
		}
		if len(dst)-start+int(ln) > n {
			return nil, errUU
		}
		line := src[1 : 1+enc]
		src = src[2+enc:]
		var out [48]byte
		for i, j := 0, 0; i < enc; i, j = i+4, j+3 {
			var v [4]byte
			for k := range 4 {
				if v[k], ok = uuVal(line[i+k]); !ok {
					return nil, errUU
				}
			}
			out[j] = v[0]<<2 | v[1]>>4
			out[j+1] = v[1]<<4 | v[2]>>2
			out[j+2] = v[2]<<6 | v[3]
		}
		dst = append(dst, out[:ln]...)
	}
	if len(dst)-start != n {
		return nil, errUU
	}
	return dst, nil
}

func init() {
	Register(&Kind{ID: 2, Name: "uuencode", Summary: "stores data uuencoded (grows it by a third): the engine with a size-increasing codec",
		New: func(int) (Codec, error) { return uuCodec{}, nil }})
}
