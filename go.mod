module cairnfs.dev/cairn

go 1.26.0

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/klauspost/compress v1.20.3
	github.com/pelletier/go-toml/v2 v2.4.3
	github.com/pierrec/lz4/v4 v4.1.33
	github.com/tink-crypto/tink-go/v2 v2.6.0
	golang.org/x/crypto v0.58.0
	golang.org/x/sys v0.49.0
	golang.org/x/term v0.47.0
)
