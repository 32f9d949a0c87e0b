package shard

import (
	"bytes"
	"testing"
)

func TestParseState(t *testing.T) {
	good := State{V: 1, Cur: Layout{Scheme: Hash, Buckets: 512, Prefix: ".shard."}, From: &Layout{Scheme: Hash, Buckets: 256, Prefix: ".shard."}, Next: 3}
	if s, err := ParseState(good.Encode()); err != nil || s.Cur != good.Cur || *s.From != *good.From || s.Next != 3 {
		t.Fatalf("round trip: %+v %v", s, err)
	}
	for _, bad := range []string{
		``, `{}`, `{"v":2,"cur":{"scheme":"hash","buckets":4,"prefix":"p"}}`,
		`{"v":1,"cur":{"scheme":"hash","buckets":3,"prefix":"p"}}`,
		`{"v":1,"cur":{"scheme":"flat"}}`,
		`{"v":1,"cur":{"scheme":"digits","buckets":10000,"prefix":"p"}}`,
		`{"v":1,"cur":{"scheme":"hash","buckets":4,"prefix":"a/b"}}`,
		`{"v":1,"cur":{"scheme":"hash","buckets":4,"prefix":"p"},"next":1}`,
		`{"v":1,"cur":{"scheme":"hash","buckets":4,"prefix":"p"},"from":{"scheme":"hash","buckets":8,"prefix":"p"}}`,
		`{"v":1,"cur":{"scheme":"hash","buckets":8,"prefix":"p"},"from":{"scheme":"hash","buckets":4,"prefix":"p"},"next":5}`,
		`{"v":1,"cur":{"scheme":"digits","buckets":100,"prefix":"p"},"from":{"scheme":"hash","buckets":4,"prefix":"p"}}`,
	} {
		if _, err := ParseState([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// FuzzParseState: the record parser never panics, and what it accepts
// encodes to a record it reads back the same, whose layouts give names
// keys below 2^62 in buckets that exist.
func FuzzParseState(f *testing.F) {
	f.Add([]byte(`{"v":1,"cur":{"scheme":"hash","buckets":256,"prefix":".shard."}}`))
	f.Add([]byte(`{"v":1,"cur":{"scheme":"digits","buckets":1000,"prefix":".shard."},"from":{"scheme":"flat"}}`))
	f.Add([]byte(`{"v":1,"cur":{"scheme":"hash","buckets":512,"prefix":"x"},"from":{"scheme":"hash","buckets":2,"prefix":"x"},"next":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseState(b)
		if err != nil {
			return
		}
		again, err := ParseState(s.Encode())
		if err != nil || !bytes.Equal(again.Encode(), s.Encode()) {
			t.Fatalf("%s: re-read %s, %v", b, again.Encode(), err)
		}
		for _, name := range []string{"0", "123456", "a", string(b)} {
			for _, l := range []*Layout{&s.Cur, s.From} {
				if l == nil || l.Scheme == Flat {
					continue
				}
				if k, bk := l.Key(name), l.Bucket(name); k >= 1<<keyBits || bk < 0 || bk >= l.Buckets || l.firstKey(bk) > k || k >= l.firstKey(bk+1) {
					t.Fatalf("%s: %q key %x bucket %d", l, name, k, bk)
				}
			}
		}
	})
}
