package replica_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "cairnfs.dev/cairn/layers/null"
	"cairnfs.dev/cairn/spec"
)

// TestCheckRefusesBadReplicas: replicas in one directory, one inside
// another (also through a symbolic link and under other layers), or fewer
// than two, are refused by cairn check, at the lower in over.
func TestCheckRefusesBadReplicas(t *testing.T) {
	d := t.TempDir()
	os.MkdirAll(filepath.Join(d, "a", "inner"), 0o755)
	os.Mkdir(filepath.Join(d, "b"), 0o755)
	os.Symlink(filepath.Join(d, "a"), filepath.Join(d, "link"))
	specOf := func(over, x, y string) string {
		return `mount = "r"
[layer.r]
type = "replica"
over = ` + over + `
[layer.x]
type = "local"
path = "` + x + `"
[layer.n]
type = "null"
over = "y"
[layer.y]
type = "local"
path = "` + y + `"
`
	}
	for _, c := range []struct{ over, x, y, want string }{
		{`["x", "n"]`, "a", "link", `spec.toml:4:14: layer "r" (type replica): replicas 1 and 2 are the same directory`},
		{`["x", "n"]`, "a", "a/inner", `spec.toml:4:14: layer "r" (type replica): replica 2 (` + filepath.Join(d, "a", "inner") + `) is inside replica 1`},
		{`["n", "x"]`, "a/inner", "a", `spec.toml:4:14: layer "r" (type replica): replica 2 (` + filepath.Join(d, "a", "inner") + `) is inside replica 1`},
		{`["x"]`, "a", "b", `layer "r" (type replica) stacks over 1 layers ("x"); it takes 2 to 32`},
	} {
		text := specOf(c.over, filepath.Join(d, c.x), filepath.Join(d, c.y))
		_, err := spec.Parse("spec.toml", []byte(text))
		if err == nil {
			t.Errorf("over %s of %s and %s: accepted", c.over, c.x, c.y)
			continue
		}
		if got := spec.Detail(err); !strings.Contains(got, c.want) {
			t.Errorf("over %s of %s and %s: %s\nwant %s", c.over, c.x, c.y, got, c.want)
		}
	}
	if _, err := spec.Parse("spec.toml", []byte(specOf(`["x", "n"]`, filepath.Join(d, "a"), filepath.Join(d, "b")))); err != nil {
		t.Errorf("two distinct replicas: %v", err)
	}
	// A negative timeout (which would wait for ever without a word).
	neg := strings.Replace(specOf(`["x", "n"]`, filepath.Join(d, "a"), filepath.Join(d, "b")), `type = "replica"`, `type = "replica"`+"\ntimeout = \"-1s\"", 1)
	if _, err := spec.Parse("spec.toml", []byte(neg)); err == nil || !strings.Contains(spec.Detail(err), `spec.toml:4:11: layer "r": option "timeout": a duration of 0`) {
		t.Errorf("timeout = \"-1s\": %v", err)
	}
}

// TestExplainPassthrough: explain says that passthrough = false keeps the
// replica's files from the kernel (its reads fail over), and that they are
// passed through otherwise.
func TestExplainPassthrough(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	for opts, want := range map[string]string{
		"":                    "kernel passthrough: yes",
		"(passthrough=false)": `kernel passthrough: no: layer "replica" (replica) keeps its files from the kernel: passthrough = false`,
		"(balance_size=0)":    "kernel passthrough: yes",
		"(balance_size=1MiB)": "kernel passthrough: yes",
	} {
		s, err := spec.ParseInline("replica" + opts + ":" + a + ":" + b)
		if err != nil {
			t.Fatalf("%s: %v", opts, spec.Detail(err))
		}
		var out strings.Builder
		s.Explain(&out)
		if !strings.Contains(out.String(), want) {
			t.Errorf("%s: explain does not say %q:\n%s", opts, want, out.String())
		}
	}
}
