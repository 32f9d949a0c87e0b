package crypt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSecretSources(t *testing.T) {
	dir := t.TempDir()
	pf := filepath.Join(dir, "p")
	os.WriteFile(pf, []byte("line one\r\nline two\n"), 0o600)
	if b, err := GetSecret(pf, "", "passphrase", false, false); err != nil || string(b) != "line one" {
		t.Errorf("passfile: %q %v", b, err)
	}
	os.WriteFile(pf, []byte("\n"), 0o600)
	if _, err := GetSecret(pf, "", "passphrase", false, false); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty passfile: %v", err)
	}
	if _, err := GetSecret(filepath.Join(dir, "missing"), "", "passphrase", false, false); err == nil {
		t.Error("missing passfile accepted")
	}
	if b, err := GetSecret("", "printf 'from a command\\nignored'", "passphrase", false, false); err != nil || string(b) != "from a command" {
		t.Errorf("extpass: %q %v", b, err)
	}
	if _, err := GetSecret("", "echo secret-output; exit 3", "passphrase", false, false); err == nil || strings.Contains(err.Error(), "secret-output") {
		t.Errorf("failing extpass: %v", err)
	}
	if _, err := GetSecret(pf, "true", "passphrase", false, false); err == nil {
		t.Error("both sources accepted")
	}
	if _, err := GetSecret("", "", "passphrase", false, false); err == nil || !strings.Contains(err.Error(), "passfile") {
		t.Errorf("no source: %v", err)
	}
}
