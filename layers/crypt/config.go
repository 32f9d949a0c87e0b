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

	"cairn/layer"
	"cairn/layers/local"
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
	Time      uint32 `json:"time,omitempty"`
	MemoryKiB uint32 `json:"memory_kib,omitempty"`
	Threads   uint8  `json:"threads,omitempty"`
	// scrypt
	N int `json:"n,omitempty"`
	R int `json:"r,omitempty"`
	P int `json:"p,omitempty"`
}

// DefaultKDF is Argon2id with RFC 9106's second recommended parameters.
func DefaultKDF() KDF { return KDF{Name: Argon2id, Time: 3, MemoryKiB: 64 << 10, Threads: 4} }

func (k *KDF) check() error {
	switch k.Name {
	case Argon2id:
		if k.Time < 1 || k.MemoryKiB < 8*uint32(max(k.Threads, 1)) || k.Threads < 1 || k.MemoryKiB > 4<<20 {
			return fmt.Errorf("argon2id parameters out of range (time %d, memory %d KiB, threads %d)", k.Time, k.MemoryKiB, k.Threads)
		}
	case Scrypt:
		if k.N < 2 || k.N&(k.N-1) != 0 || k.R < 1 || k.P < 1 || k.N > 1<<24 || k.R*k.P >= 1<<30 {
			return fmt.Errorf("scrypt parameters out of range (N %d, r %d, p %d)", k.N, k.R, k.P)
		}
	default:
		return fmt.Errorf("unknown key derivation %q (want %s or %s)", k.Name, Argon2id, Scrypt)
	}
	if len(k.Salt) < 16 {
		return errors.New("KDF salt too short")
	}
	return nil
}

func (k *KDF) derive(pass []byte) ([]byte, error) {
	if err := k.check(); err != nil {
		return nil, err
	}
	if k.Name == Argon2id {
		return argon2.IDKey(pass, k.Salt, k.Time, k.MemoryKiB, k.Threads, 32), nil
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
var (
	ErrWrongPassphrase = errors.New("wrong passphrase")
	ErrWrongMasterKey  = errors.New("wrong master key")
)

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
	nonce := make([]byte, a.NonceSize())
	rand.Read(nonce)
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
	Cipher    string // AES256GCM (default) or XChaCha20Poly1305
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
		p.Cipher = AES256GCM
	}
	if p.BlockSize == 0 {
		p.BlockSize = 4096
	}
	if p.KDF.Name == "" {
		p.KDF = DefaultKDF()
	}
	p.KDF.Salt = make([]byte, 32)
	rand.Read(p.KDF.Salt)
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
	rand.Read(master)
	if err := c.wrap(master, pass); err != nil {
		return nil, err
	}
	iv := make([]byte, dirIVSize)
	rand.Read(iv)
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
	data, err := layer.ReadFile(ctx, lower, ConfigName)
	if errors.Is(err, syscall.ENOENT) {
		return nil, fmt.Errorf("no crypt configuration: expected %s (run 'cairn init' to create it)", where(lower, ConfigName))
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", where(lower, ConfigName), err)
	}
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("%s is damaged: %v", where(lower, ConfigName), err)
	}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("%s: %v", where(lower, ConfigName), err)
	}
	return &c, nil
}

// ChangePassphrase re-wraps the master key (opened by old, or given as
// master) with a new passphrase and, if kdf.Name is set, new KDF
// parameters. The data is not touched.
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
	rand.Read(c.KDF.Salt)
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
