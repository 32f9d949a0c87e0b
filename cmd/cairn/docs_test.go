//go:build linux

package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/registry"
	"cairnfs.dev/cairn/spec"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the outputs shown in docs/tutorial.md")

// TestSpecDocFresh fails when docs/spec.md is not what `cairn layers
// --markdown` prints, for instance after a layer type was added.
func TestSpecDocFresh(t *testing.T) {
	have, err := os.ReadFile("../../docs/spec.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(have) != specMarkdown() {
		t.Fatalf("docs/spec.md is stale: regenerate it with\n\tgo generate ./cmd/cairn\n(or: go run ./cmd/cairn layers --markdown > docs/spec.md)")
	}
}

// codeBlocks returns the fenced blocks of a markdown file: their info
// string, first line number and text.
type block struct {
	info  string
	line  int
	lines []string
}

func codeBlocks(md string) []block {
	var out []block
	var cur *block
	for i, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "```") {
			if cur == nil {
				cur = &block{info: strings.TrimSpace(l[3:]), line: i + 1}
			} else {
				out = append(out, *cur)
				cur = nil
			}
			continue
		}
		if cur != nil {
			cur.lines = append(cur.lines, l)
		}
	}
	return out
}

// TestSpecDocExamples checks every complete spec (one with a mount) in
// docs/spec.md and README.md: it must be good once its directories exist, and explain must
// work on it.
func TestSpecDocExamples(t *testing.T) {
	md, err := os.ReadFile("../../docs/spec.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := codeBlocks(string(md))
	// The README's spec is a here-document in a sh block.
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range codeBlocks(string(readme)) {
		text := strings.Join(b.lines, "\n")
		if _, rest, ok := strings.Cut(text, "<<'END'\n"); ok {
			body, _, _ := strings.Cut(rest, "\nEND")
			blocks = append(blocks, block{info: "toml", line: b.line, lines: strings.Split(body, "\n")})
		}
	}
	n := 0
	for _, b := range blocks {
		text := strings.Join(b.lines, "\n") + "\n"
		if b.info != "toml" || !strings.Contains(text, "mount =") {
			continue
		}
		n++
		root := t.TempDir()
		text = strings.ReplaceAll(text, `"/srv/`, `"`+root+`/srv/`)
		s, _ := spec.Parse("example.toml", []byte(text))
		for _, l := range s.Layers {
			if t := l.TypeInfo(); t != nil {
				for _, o := range t.Options {
					if p, ok := l.Options[o.Name].(string); ok && o.Kind == registry.Dir {
						os.MkdirAll(p, 0o755)
					}
				}
			}
		}
		file := filepath.Join(root, "example.toml")
		os.WriteFile(file, []byte(text), 0o644)
		var out bytes.Buffer
		if code := runCheck([]string{file}, &out, &out); code != exitOK {
			t.Errorf("example at line %d: it does not check:\n%s", b.line, out.String())
		}
		out.Reset()
		if code := runExplain([]string{file}, &out, &out); code != exitOK {
			t.Errorf("example at line %d: explain fails:\n%s", b.line, out.String())
		}
	}
	t.Logf("%d examples checked", n)
	if n < 4 {
		t.Errorf("only %d examples found in docs/spec.md and README.md", n)
	}
}

// TestTutorial runs docs/tutorial.md in a temporary directory: each
// ```toml block whose first line is "# FILE" is written to FILE, and each
// "$ command" of a ```console block is run and its output compared with the
// lines shown under it. cairn check, explain and layers run in the test;
// cairn mount and umount run the cairn command (real FUSE mounts, checked
// in /proc/self/mountinfo); other commands (mkdir, echo, ls, cat) run with
// sh. The directory appears as /home/you/demo in the outputs.
func TestTutorial(t *testing.T) {
	const shown = "/home/you/demo"
	mdPath, _ := filepath.Abs("../../docs/tutorial.md")
	md, err := os.ReadFile(mdPath)
	if err != nil {
		t.Fatal(err)
	}
	mounttest.Binary(t) // built here: go build needs the module's directory
	dir := t.TempDir()
	t.Chdir(dir)
	lines := strings.Split(string(md), "\n")
	var outLines []string // the tutorial with outputs as they are now
	in := ""              // the kind of block we are in
	var file *os.File
	checked := 0
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(l, "```") {
			if in == "" {
				in = strings.TrimSpace(l[3:])
				if in == "" {
					in = "text"
				}
			} else {
				in = ""
				if file != nil {
					file.Close()
					file = nil
				}
			}
			outLines = append(outLines, l)
			continue
		}
		switch in {
		case "toml":
			if file == nil && strings.HasPrefix(lines[i-1], "```") {
				name, ok := strings.CutPrefix(l, "# ")
				if !ok || strings.ContainsAny(name, " /") {
					t.Fatalf("tutorial.md:%d: a toml block must start with # FILE", i+1)
				}
				file, err = os.Create(name)
				if err != nil {
					t.Fatal(err)
				}
			}
			fmt.Fprintln(file, strings.ReplaceAll(l, shown, dir))
			outLines = append(outLines, l)
			continue
		case "console":
			cmd, ok := strings.CutPrefix(l, "$ ")
			if !ok {
				t.Fatalf("tutorial.md:%d: expected a $ command line, found %q", i+1, l)
			}
			outLines = append(outLines, l)
			var want []string
			for i+1 < len(lines) && !strings.HasPrefix(lines[i+1], "$ ") && !strings.HasPrefix(lines[i+1], "```") {
				i++
				want = append(want, lines[i])
			}
			got, run := runDocCommand(t, i+1, strings.ReplaceAll(cmd, shown, dir))
			if !run {
				outLines = append(outLines, want...)
				continue
			}
			checked++
			got = strings.ReplaceAll(got, dir, shown)
			gotLines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
			if got == "" {
				gotLines = nil
			}
			outLines = append(outLines, gotLines...)
			if strings.Join(gotLines, "\n") != strings.Join(want, "\n") && !*updateDocs {
				t.Errorf("tutorial.md:%d: $ %s\n--- got\n%s\n--- shown\n%s", i+1, cmd, strings.Join(gotLines, "\n"), strings.Join(want, "\n"))
			}
			continue
		}
		outLines = append(outLines, l)
	}
	if checked < 5 {
		t.Errorf("only %d commands checked", checked)
	}
	if *updateDocs {
		if err := os.WriteFile(mdPath, []byte(strings.Join(outLines, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// runDocCommand runs one tutorial command; run is false for commands that
// are only shown.
func runDocCommand(t *testing.T, line int, cmd string) (out string, run bool) {
	args, err := shellWords(cmd)
	if err != nil || len(args) == 0 {
		t.Fatalf("tutorial.md:%d: cannot split %q: %v", line, cmd, err)
	}
	var b bytes.Buffer
	if args[0] != "cairn" {
		// The shell runs in the test's directory, never in a mount
		// (the mounts are served by cairn processes anyway).
		o, err := exec.Command("sh", "-c", cmd).CombinedOutput()
		if err != nil {
			t.Errorf("tutorial.md:%d: $ %s: %v\n%s", line, cmd, err, o)
		}
		return string(o), true
	}
	if len(args) < 2 {
		t.Fatalf("tutorial.md:%d: cairn needs a command", line)
	}
	switch args[1] {
	case "check":
		runCheck(args[2:], &b, &b)
	case "explain":
		runExplain(args[2:], &b, &b)
	case "layers":
		runLayers(args[2:], &b, &b)
	case "mount":
		var pos []string
		for _, a := range args[2:] {
			if !strings.HasPrefix(a, "-") {
				pos = append(pos, a)
			}
		}
		if code := runCheck(append([]string{"-q"}, pos...), &b, &b); code != exitOK {
			t.Errorf("tutorial.md:%d: the spec of %q does not check:\n%s", line, cmd, b.String())
			return "", false
		}
		mounttest.Need(t)
		mnt, _ := filepath.Abs(pos[len(pos)-1])
		out, code := mounttest.Run(t, args[1:]...)
		t.Cleanup(func() {
			if isMounted(mnt) {
				syscall.Unmount(mnt, syscall.MNT_DETACH)
			}
		})
		if code != exitOK || !isMounted(mnt) {
			t.Errorf("tutorial.md:%d: $ %s: exit %d, mounted %v\n%s", line, cmd, code, isMounted(mnt), out)
		}
		return out, true
	case "fsck", "convert":
		out, _ := mounttest.Run(t, args[1:]...)
		return out, true
	case "umount":
		mnt, _ := filepath.Abs(args[len(args)-1])
		out, code := mounttest.Run(t, args[1:]...)
		if code != exitOK || isMounted(mnt) {
			t.Errorf("tutorial.md:%d: $ %s: exit %d, still mounted %v\n%s", line, cmd, code, isMounted(mnt), out)
		}
		return out, true
	default:
		return "", false
	}
	return b.String(), true
}

// shellWords splits a command line with ' and " quotes.
func shellWords(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\'' || c == '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("unclosed %c", c)
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}
