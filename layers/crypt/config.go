package crypt

import (
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/scrypt"
	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// ConfigName is the configuration file at the root of the lower layer. It
// holds the master key wrapped by a key derived from the passphrase, and the
// volume's parameters; it is never shown through the layer.
const ConfigName = ".cairn-crypt.conf"

const (
	configFormat  = "cairn-crypt"
	configVersion = 1
	masterKeySize = 32
)

// KDF names.
const (
	Argon2id = "argon2id"
	Scrypt   = "scrypt"
)

// Config is the configuration file (JSON).
type Config struct {
	Format    string `json:"format"`
	Version   int    `json:"version"`
	Cipher    string `json:"cipher"`
	BlockSize int    `json:"block_size"`
	KDF       KDF    `json:"kdf"`
	// WrappedKey is nonce || AES-256-GCM(KEK, master key), with the
	// parameters (Config.params) as associated data.
	WrappedKey []byte `json:"wrapped_key"`
	// KeyCheck is HMAC-SHA256(HKDF(master key, "config check"), params):
	// it tells a wrong master key from a right one.
	KeyCheck []byte `json:"key_check"`
}

// KDF says how the key-encryption key derives from the passphrase.
type KDF struct {
	Name string `json:"name"`
	Salt []byte `json:"salt"`
	// Argon2id
	Time      uint64 `json:"time,omitempty"`
	MemoryKiB uint64 `json:"memory_kib,omitempty"`
	Threads   uint64 `json:"threads,omitempty"`
	// scrypt
	N int `json:"n,omitempty"`
	R int `json:"r,omitempty"`
	P int `json:"p,omitempty"`
}

// DefaultKDF is Argon2id with RFC 9106's second recommended parameters.
func DefaultKDF() KDF { return KDF{Name: Argon2id, Time: 3, MemoryKiB: 64 << 10, Threads: 4} }

// The bounds of every key-derivation parameter. A configuration (which
// anyone who can write the lower directory can change) is refused outside
// the maximums, so that it cannot make the mount allocate or compute without
// bound, and so are the settings given to Init and ChangePassphrase; cairn
// init and passwd also refuse settings below the minimums (KDF.Check). An
// existing volume made with weaker settings still opens.
const (
	Argon2MinTime, Argon2MaxTime           = 2, 64
	Argon2MinMemoryKiB, Argon2MaxMemoryKiB = 19 << 10, 4 << 20 // 19 MiB (OWASP's floor) .. 4 GiB
	Argon2MinThreads, Argon2MaxThreads     = 1, 64
	ScryptMinN, ScryptMaxN                 = 1 << 15, 1 << 22
	ScryptMinR, ScryptMaxR                 = 8, 32
	ScryptMinP, ScryptMaxP                 = 1, 16
	scryptMaxMemory                        = 4 << 30 // 128·N·r bytes
)

// RangeError is a key-derivation parameter out of its allowed range.
type RangeError struct {
	Field    string // as in the configuration file: "kdf.time"
	Value    uint64
	Min, Max uint64
	Why      string // more than the range, if any
}

func (e *RangeError) Error() string {
	if e.Why != "" {
		return fmt.Sprintf("%s = %d: %s", e.Field, e.Value, e.Why)
	}
	return fmt.Sprintf("%s = %d is out of range (allowed %d..%d)", e.Field, e.Value, e.Min, e.Max)
}

func inRange(field string, v, lo, hi uint64) error {
	if v < lo || v > hi {
		return &RangeError{Field: field, Value: v, Min: lo, Max: hi}
	}
	return nil
}

// Check reports whether the settings are within the bounds allowed for a
// new volume or passphrase (minimums and maximums), naming each field out
// of range with its allowed range.
// The salt is not checked (it is drawn when the settings are used).
func (k KDF) Check() error {
	k.Salt = make([]byte, 32)
	return k.checkBounds(true)
}

// check enforces the maximums (and what the KDF itself needs).
func (k *KDF) check() error { return k.checkBounds(false) }

func (k *KDF) checkBounds(strong bool) error {
	lo := func(min, floor uint64) uint64 {
		if strong {
			return min
		}
		return floor
	}
	var errs []error
	switch k.Name {
	case Argon2id:
		if k.N != 0 || k.R != 0 || k.P != 0 {
			errs = append(errs, errors.New("kdf: argon2id takes time, memory_kib and threads, not n, r, p"))
		}
		errs = append(errs,
			inRange("kdf.time", uint64(k.Time), lo(Argon2MinTime, 1), Argon2MaxTime),
			inRange("kdf.threads", uint64(k.Threads), lo(Argon2MinThreads, 1), Argon2MaxThreads),
			inRange("kdf.memory_kib", uint64(k.MemoryKiB), lo(Argon2MinMemoryKiB, 8*uint64(max(k.Threads, 1))), Argon2MaxMemoryKiB))
	case Scrypt:
		if k.Time != 0 || k.MemoryKiB != 0 || k.Threads != 0 {
			errs = append(errs, errors.New("kdf: scrypt takes n, r and p, not time, memory_kib, threads"))
		}
		if k.N < 0 || k.R < 0 || k.P < 0 {
			errs = append(errs, errors.New("kdf: n, r and p cannot be negative"))
			break
		}
		n, r, p := uint64(k.N), uint64(k.R), uint64(k.P)
		errs = append(errs,
			inRange("kdf.n", n, lo(ScryptMinN, 2), ScryptMaxN),
			inRange("kdf.r", r, lo(ScryptMinR, 1), ScryptMaxR),
			inRange("kdf.p", p, lo(ScryptMinP, 1), ScryptMaxP))
		if n&(n-1) != 0 {
			errs = append(errs, &RangeError{Field: "kdf.n", Value: n, Why: "not a power of two"})
		} else if n <= ScryptMaxN && r <= ScryptMaxR && 128*n*r > scryptMaxMemory {
			errs = append(errs, &RangeError{Field: "kdf.n", Value: n, Why: fmt.Sprintf("with r = %d needs %d MiB, more than the %d MiB allowed (128·n·r bytes)", r, 128*n*r>>20, scryptMaxMemory>>20)})
		}
	default:
		return fmt.Errorf("kdf.name: unknown key derivation %q (want %s or %s)", k.Name, Argon2id, Scrypt)
	}
	if len(k.Salt) < 16 || len(k.Salt) > 64 {
		errs = append(errs, fmt.Errorf("kdf.salt: %d bytes (allowed 16..64)", len(k.Salt)))
	}
	return errors.Join(errs...)
}

func (k *KDF) derive(pass []byte) ([]byte, error) {
	if err := k.check(); err != nil {
		return nil, err
	}
	if k.Name == Argon2id {
		return argon2.IDKey(pass, k.Salt, uint32(k.Time), uint32(k.MemoryKiB), uint8(k.Threads), 32), nil
	}
	return scrypt.Key(pass, k.Salt, k.N, k.R, k.P, 32)
}

// params is the canonical text of everything the master key is bound to.
func (c *Config) params() []byte {
	k := c.KDF
	return fmt.Appendf(nil, "%s v%d cipher=%s block_size=%d kdf=%s salt=%x time=%d memory_kib=%d threads=%d n=%d r=%d p=%d",
		c.Format, c.Version, c.Cipher, c.BlockSize, k.Name, k.Salt, k.Time, k.MemoryKiB, k.Threads, k.N, k.R, k.P)
}

func (c *Config) check() error {
	if c.Format != configFormat {
		return fmt.Errorf("not a cairn crypt configuration (format %q)", c.Format)
	}
	if c.Version != configVersion {
		return fmt.Errorf("configuration of version %d; this cairn reads version %d", c.Version, configVersion)
	}
	if _, err := newContent(c.Cipher, make([]byte, 32), c.BlockSize, rand.Reader); err != nil {
		return err
	}
	return c.KDF.check()
}

// ErrWrongPassphrase and ErrWrongMasterKey say that a secret does not open
// the configuration.
// Both match layer.ErrWrongSecret.
var (
	ErrWrongPassphrase = wrongSecret("wrong passphrase")
	ErrWrongMasterKey  = wrongSecret("wrong master key")
)

type wrongSecret string

func (e wrongSecret) Error() string        { return string(e) }
func (e wrongSecret) Is(target error) bool { return target == layer.ErrWrongSecret }

// subkey derives one of the volume's keys from the master key.
func subkey(master []byte, purpose string, n int) []byte {
	k, err := hkdf.Key(sha256.New, master, nil, "cairn-crypt v1 "+purpose, n)
	if err != nil {
		panic(err)
	}
	return k
}

func (c *Config) keyCheck(master []byte) []byte {
	m := hmac.New(sha256.New, subkey(master, "config check", 32))
	m.Write(c.params())
	return m.Sum(nil)
}

// wrap sets WrappedKey and KeyCheck: master wrapped by the passphrase.
func (c *Config) wrap(master, pass []byte) error {
	kek, err := c.KDF.derive(pass)
	if err != nil {
		return err
	}
	a := newAEAD(AES256GCM, kek)
	clear(kek)
	nonce := make([]byte, a.NonceSize())
	if _, err := io.ReadFull(rand.Reader, nonce); err != nil {
		return fmt.Errorf("the random source failed: %w", err)
	}
	c.WrappedKey = a.Seal(nonce, nonce, master, c.params())
	c.KeyCheck = c.keyCheck(master)
	return nil
}

// Unwrap returns the master key the passphrase opens.
func (c *Config) Unwrap(pass []byte) ([]byte, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	kek, err := c.KDF.derive(pass)
	if err != nil {
		return nil, err
	}
	a := newAEAD(AES256GCM, kek)
	clear(kek)
	if len(c.WrappedKey) != a.NonceSize()+masterKeySize+a.Overhead() {
		return nil, errors.New("the wrapped master key has the wrong size")
	}
	ns := a.NonceSize()
	master, err := a.Open(nil, c.WrappedKey[:ns], c.WrappedKey[ns:], c.params())
	if err != nil {
		return nil, ErrWrongPassphrase
	}
	return master, nil
}

// CheckMasterKey verifies a master key given for recovery.
func (c *Config) CheckMasterKey(master []byte) error {
	if err := c.check(); err != nil {
		return err
	}
	if len(master) != masterKeySize || !hmac.Equal(c.keyCheck(master), c.KeyCheck) {
		return ErrWrongMasterKey
	}
	return nil
}

// FormatMasterKey writes a master key for a person: hex in groups of 8.
func FormatMasterKey(k []byte) string {
	h := hex.EncodeToString(k)
	var parts []string
	for i := 0; i < len(h); i += 8 {
		parts = append(parts, h[i:i+8])
	}
	return strings.Join(parts, "-")
}

// ParseMasterKey reads what FormatMasterKey wrote (dashes and spaces are
// ignored).
func ParseMasterKey(s string) ([]byte, error) {
	s = strings.Map(func(r rune) rune {
		if r == '-' || r == ' ' || r == '\n' || r == '\t' || r == '\r' {
			return -1
		}
		return r
	}, s)
	k, err := hex.DecodeString(s)
	if err != nil || len(k) != masterKeySize {
		return nil, fmt.Errorf("a master key is %d hexadecimal digits (dashes allowed)", 2*masterKeySize)
	}
	return k, nil
}

// InitParams are the choices made at cairn init.
type InitParams struct {
	Cipher    string // XChaCha20Poly1305 (default) or AES256GCM
	BlockSize int    // default 4096
	KDF       KDF    // default DefaultKDF(); the salt is drawn here
}

// Init creates a new encrypted volume in lower (which must be empty): a
// random master key wrapped by pass, the configuration file and the root's
// IV. It returns the master key, for recovery.
func Init(ctx context.Context, lower layer.FS, p InitParams, pass []byte) ([]byte, error) {
	if len(pass) == 0 {
		return nil, errors.New("empty passphrase")
	}
	if p.Cipher == "" {
		p.Cipher = XChaCha20Poly1305
	}
	if p.BlockSize == 0 {
		p.BlockSize = 4096
	}
	if p.KDF.Name == "" {
		p.KDF = DefaultKDF()
	}
	p.KDF.Salt = make([]byte, 32)
	if _, err := io.ReadFull(rand.Reader, p.KDF.Salt); err != nil {
		return nil, fmt.Errorf("the random source failed: %w", err)
	}
	c := &Config{Format: configFormat, Version: configVersion, Cipher: p.Cipher, BlockSize: p.BlockSize, KDF: p.KDF}
	if err := c.check(); err != nil {
		return nil, err
	}
	ents, err := lower.ReadDir(ctx, "", false)
	if err != nil {
		return nil, fmt.Errorf("cannot list %s: %w", where(lower, ""), err)
	}
	for _, e := range ents {
		if e.Name == ConfigName {
			return nil, fmt.Errorf("%s exists already: this directory is initialised", where(lower, ConfigName))
		}
	}
	if len(ents) > 0 {
		return nil, fmt.Errorf("%s is not empty: initialise an empty directory", where(lower, ""))
	}
	master := make([]byte, masterKeySize)
	iv := make([]byte, dirIVSize)
	if _, err := io.ReadFull(rand.Reader, master); err != nil {
		return nil, fmt.Errorf("the random source failed: %w", err)
	}
	if _, err := io.ReadFull(rand.Reader, iv); err != nil {
		return nil, fmt.Errorf("the random source failed: %w", err)
	}
	if err := c.wrap(master, pass); err != nil {
		return nil, err
	}
	if err := writeNew(ctx, lower, dirIVName, ivFile(subkey(master, "diriv", 32), iv), 0o444, true); err != nil {
		return nil, err
	}
	if err := writeConfig(ctx, lower, c); err != nil {
		return nil, err
	}
	return master, nil
}

// ReadConfig reads the configuration file from the lower layer.
func ReadConfig(ctx context.Context, lower layer.FS) (*Config, error) {
	data, err := readConfigFile(ctx, lower)
	if errors.Is(err, syscall.ENOENT) {
		return nil, fmt.Errorf("no crypt configuration: expected %s (run 'cairn init' to create it)", where(lower, ConfigName))
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", where(lower, ConfigName), err)
	}
	c, err := parseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", where(lower, ConfigName), err)
	}
	return c, nil
}

// readConfigFile reads the configuration file, at most maxConfig+1 bytes
// of it (a larger one is refused by parseConfig).
func readConfigFile(ctx context.Context, lower layer.FS) ([]byte, error) {
	f, err := lower.Open(ctx, ConfigName, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Release(ctx)
	b := make([]byte, maxConfig+1)
	n, err := readFull(ctx, f, b, 0)
	return b[:n], err
}

// maxConfig is the largest configuration file read.
const maxConfig = 64 << 10

// parseConfig decodes and checks a configuration file.
func parseConfig(data []byte) (*Config, error) {
	if len(data) > maxConfig {
		return nil, fmt.Errorf("damaged: %d bytes, more than a configuration holds", len(data))
	}
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("damaged: %v", err)
	}
	if err := c.check(); err != nil {
		return nil, errors.New(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return &c, nil
}

// ChangePassphrase re-wraps the master key (opened by old, or given as
// master) with a new passphrase and, if kdf.Name is set, new KDF
// parameters (within the maximums; cairn passwd also enforces the minimums,
// see KDF.Check); otherwise the stored ones are kept. The data is not
// touched.
func ChangePassphrase(ctx context.Context, lower layer.FS, old, master, pass []byte, kdf KDF) error {
	if len(pass) == 0 {
		return errors.New("empty new passphrase")
	}
	c, err := ReadConfig(ctx, lower)
	if err != nil {
		return err
	}
	if master != nil {
		if err := c.CheckMasterKey(master); err != nil {
			return err
		}
	} else if master, err = c.Unwrap(old); err != nil {
		return err
	}
	if kdf.Name != "" {
		c.KDF = kdf
	}
	c.KDF.Salt = make([]byte, 32)
	if _, err := io.ReadFull(rand.Reader, c.KDF.Salt); err != nil {
		return fmt.Errorf("the random source failed: %w", err)
	}
	if err := c.wrap(master, pass); err != nil {
		return err
	}
	return writeConfig(ctx, lower, c)
}

// writeConfig replaces the configuration atomically (a new file renamed
// over the old one).
func writeConfig(ctx context.Context, lower layer.FS, c *Config) error {
	data, err := json.MarshalIndent(c, "", "\t")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	tmp := ConfigName + ".new"
	lower.Unlink(ctx, tmp)
	if err := writeNew(ctx, lower, tmp, data, 0o400, true); err != nil {
		return err
	}
	if err := lower.Rename(ctx, tmp, ConfigName, 0); err != nil {
		lower.Unlink(ctx, tmp)
		return fmt.Errorf("cannot write %s: %w", where(lower, ConfigName), err)
	}
	return nil
}

// writeNew creates a file that must not exist, writes data and, with
// sync, makes it durable.
func writeNew(ctx context.Context, fs layer.FS, path string, data []byte, mode uint32, sync bool) error {
	f, _, err := fs.Create(ctx, path, unix.O_WRONLY|unix.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", where(fs, path), err)
	}
	_, err = f.WriteAt(ctx, data, 0)
	if err == nil && sync {
		err = f.Fsync(ctx, false)
	}
	if rerr := f.Release(ctx); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", where(fs, path), err)
	}
	return nil
}

// where names a path of the lower layer for a person: the real file when
// the lower is a local directory (through layers that keep names).
func where(fs layer.FS, path string) string {
	for {
		if l, ok := fs.(*local.FS); ok {
			return filepath.Join(l.Root(), path)
		}
		lw := fs.Lowers()
		if len(lw) != 1 || fs.Changes()&(layer.ChangesNames|layer.ChangesPlacement) != 0 {
			break
		}
		fs = lw[0]
	}
	if path == "" {
		return "the root of the lower layer"
	}
	return path + " at the root of the lower layer"
}

// readFull reads len(p) bytes at off, or fewer at the end of the file.
func readFull(ctx context.Context, f layer.File, p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		m, err := f.ReadAt(ctx, p[n:], off+int64(n))
		n += m
		if err == io.EOF || (err == nil && m == 0) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
