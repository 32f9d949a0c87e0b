package shard

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// Schemes: how a name chooses its bucket.
const (
	Flat   = "flat"   // no buckets: the entries are the directory's own (not yet sharded)
	Hash   = "hash"   // the top bits of a 64-bit hash of the name; 2^k buckets
	Digits = "digits" // a number's last d digits (Usenetfs); 10^d buckets; other names by hash
)

// MaxBuckets bounds the hash bucket count (digits: at most 1000).
const MaxBuckets = 1 << 16

// Layout is how one directory keeps its entries.
type Layout struct {
	Scheme  string `json:"scheme"`
	Buckets int    `json:"buckets,omitempty"`
	Prefix  string `json:"prefix,omitempty"` // bucket directories' names begin with it
}

// State is the record a sharded directory keeps as side data ("layout"):
// its layout, and while a resharding runs the layout it leaves (From) and
// the first source bucket not yet drained (Next).
type State struct {
	V    int     `json:"v"`
	Cur  Layout  `json:"cur"`
	From *Layout `json:"from,omitempty"`
	Next int     `json:"next,omitempty"`
}

func (l Layout) String() string {
	if l.Scheme == Flat {
		return Flat
	}
	return fmt.Sprintf("%s %d", l.Scheme, l.Buckets)
}

// Check says what is wrong with a layout, if anything.
func (l Layout) Check() error {
	switch l.Scheme {
	case Flat:
		if l.Buckets != 0 {
			return errors.New("a flat layout has no buckets")
		}
		return nil
	case Hash:
		if l.Buckets < 1 || l.Buckets > MaxBuckets || l.Buckets&(l.Buckets-1) != 0 {
			return fmt.Errorf("hash buckets %d: a power of two from 1 to %d", l.Buckets, MaxBuckets)
		}
	case Digits:
		if d := digits(l.Buckets); d < 1 || d > 3 {
			return fmt.Errorf("digits buckets %d: 10, 100 or 1000", l.Buckets)
		}
	default:
		return fmt.Errorf("unknown scheme %q (hash, digits)", l.Scheme)
	}
	if l.Prefix == "" || strings.ContainsAny(l.Prefix, "/\x00") || len(l.Prefix) > 64 {
		return fmt.Errorf("bucket prefix %q: 1 to 64 bytes, no \"/\"", l.Prefix)
	}
	return nil
}

// digits is d for 10^d, or 0 when n is no such power.
func digits(n int) int {
	d := 0
	for n >= 10 && n%10 == 0 {
		n /= 10
		d++
	}
	if n != 1 {
		return 0
	}
	return d
}

// ParseState reads a directory's record (what Encode wrote).
func ParseState(b []byte) (State, error) {
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("shard record %q: %v", b, err)
	}
	if s.V != 1 {
		return State{}, fmt.Errorf("shard record %q: version %d (this cairn reads 1)", b, s.V)
	}
	if err := s.Cur.Check(); err != nil || s.Cur.Scheme == Flat {
		return State{}, fmt.Errorf("shard record %q: layout: %v", b, err)
	}
	if s.From != nil {
		if err := s.From.Check(); err != nil {
			return State{}, fmt.Errorf("shard record %q: source layout: %v", b, err)
		}
		if err := canMove(*s.From, s.Cur); err != nil {
			return State{}, fmt.Errorf("shard record %q: %v", b, err)
		}
		if s.Next < 0 || s.Next > s.From.count() {
			return State{}, fmt.Errorf("shard record %q: next bucket %d of %d", b, s.Next, s.From.count())
		}
	} else if s.Next != 0 {
		return State{}, fmt.Errorf("shard record %q: next without source", b)
	}
	return s, nil
}

// Encode is the record's bytes.
func (s State) Encode() []byte {
	b, _ := json.Marshal(s)
	return b
}

// canMove says whether a resharding from one layout to another is one
// this layer does: a flat directory into any layout, or a hash layout
// grown to more buckets (each old bucket splits into 2^j new ones).
func canMove(from, to Layout) error {
	if to.Scheme == Flat {
		return errors.New("a sharded directory cannot be made flat again")
	}
	if from.Scheme == Flat {
		return nil
	}
	if from.Scheme == Hash && to.Scheme == Hash && to.Buckets > from.Buckets && from.Prefix == to.Prefix {
		return nil
	}
	return fmt.Errorf("cannot go from %s to %s (a hash layout grows to more buckets; nothing else changes in place)", from, to)
}

// count is the number of source slots: 1 for a flat directory (itself).
func (l Layout) count() int {
	if l.Scheme == Flat {
		return 1
	}
	return l.Buckets
}

// mix64 is splitmix64's finalizer: every bit of the result depends on every
// bit of x, so the top bits of FNV are spread too.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func hashName(name string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return mix64(h)
}

// keyBits: keys are below 2^62, so that a cookie (key+1) and the
// frontend's offset (cookie+2) stay positive.
const keyBits = 62

// Key is name's position in the listing order of layout l, which is also
// bucket order: bucket(name) = the key's top bits (hash), or key>>52
// (digits). Keys never change while the name exists, wherever it is kept,
// which is what makes listings stable through resharding.
func (l Layout) Key(name string) uint64 {
	h := hashName(name) >> (64 - keyBits)
	if l.Scheme != Digits {
		return h
	}
	p := uint64(l.Buckets)
	if n, ok := number(name); ok && n/p < 1<<51 {
		return (n%p)<<52 | n/p // distinct numbers, distinct keys
	}
	return (h%p)<<52 | 1<<51 | h&(1<<51-1)
}

// Bucket is the index of name's bucket.
func (l Layout) Bucket(name string) int { return l.bucketOfKey(l.Key(name)) }

func (l Layout) bucketOfKey(k uint64) int {
	switch l.Scheme {
	case Hash:
		return int(k >> (keyBits - bits.TrailingZeros(uint(l.Buckets))))
	case Digits:
		return int(k >> 52)
	}
	return 0
}

// firstKey is the smallest key of bucket b (b may be count(): the end).
func (l Layout) firstKey(b int) uint64 {
	switch l.Scheme {
	case Hash:
		return uint64(b) << (keyBits - bits.TrailingZeros(uint(l.Buckets)))
	case Digits:
		return uint64(b) << 52
	}
	if b == 0 {
		return 0
	}
	return 1 << keyBits
}

// number reads a canonical decimal number (no sign, no leading zero).
func number(name string) (uint64, bool) {
	if name == "" || len(name) > 18 || (name[0] == '0' && len(name) > 1) {
		return 0, false
	}
	n, err := strconv.ParseUint(name, 10, 64)
	return n, err == nil
}

// BucketName is the name of bucket b's directory: the prefix, the scheme's
// letter and size, and the index, in hexadecimal for hash (".shard.h8.3f":
// bucket 0x3f of 2^8) and in decimal for digits (".shard.d3.042": the
// articles whose numbers end in 042, as Usenetfs kept them).
func (l Layout) BucketName(b int) string {
	switch l.Scheme {
	case Hash:
		k := bits.TrailingZeros(uint(l.Buckets))
		return fmt.Sprintf("%sh%d.%0*x", l.Prefix, k, (k+3)/4, b)
	case Digits:
		d := digits(l.Buckets)
		return fmt.Sprintf("%sd%d.%0*d", l.Prefix, d, d, b)
	}
	return ""
}
