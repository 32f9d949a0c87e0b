package chains

import (
	"errors"
	"fmt"
	"strings"
)

// The chain record (docs/chains.md): the value of the layer's side data
// "chain" (layer.Meta) on a guarded file of the lower:
//
//	record  = version ":" link ("," link)*
//	version = "1"
//	link    = [a-z0-9] [a-z0-9_-]{0,31}
//
// Links are named top first: "1:zstd,crypt" stores the file's bytes
// zstd-encoded, and that encrypted. A file without the record is unguarded.
const (
	recordVersion = "1"
	maxLinks      = 64
	maxLinkName   = 32
	metaKey       = "chain"
)

// formatRecord is the record of a chain (not empty).
func formatRecord(names []string) []byte {
	return []byte(recordVersion + ":" + strings.Join(names, ","))
}

// parseRecord returns the links of a record, top first.
func parseRecord(b []byte) ([]string, error) {
	s := string(b)
	v, rest, ok := strings.Cut(s, ":")
	if !ok {
		return nil, errors.New("chain record without a version")
	}
	if v != recordVersion {
		return nil, fmt.Errorf("chain record of format version %q (this cairn reads version %s)", v, recordVersion)
	}
	return parseNames(rest)
}

// parseNames parses a comma-separated list of link names (the record's
// body, and the value of user.cairn.chain, where blanks around names are
// allowed). The empty list is no chain.
func parseNames(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > maxLinks {
		return nil, fmt.Errorf("a chain of %d links (at most %d)", len(parts), maxLinks)
	}
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if !validName(p) {
			return nil, fmt.Errorf("link %q is not a link name", p)
		}
		parts[i] = p
	}
	return parts, nil
}

func validName(n string) bool {
	if n == "" || len(n) > maxLinkName {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '_' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}
