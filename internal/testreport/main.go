// Command testreport reads `go test -json` on standard input and prints what
// a plain `go test` prints (a line per package, the output of failed tests),
// then the tests that were skipped with their reasons, and as its last line
// the number of tests that passed, failed and were skipped. test.sh uses it.
//
// It exits with 1 when a test or a package failed, and with 1 when a test
// was skipped and the environment has CAIRN_FAIL_ON_SKIP=1 (CI). A test that
// a long job runs (its skip message begins with LongJob, e.g. the CephFS
// suites: "long job: ... run them with ./test.sh --ceph") is listed and
// counted apart, and is no skip for CAIRN_FAIL_ON_SKIP: the default run
// leaves it to the long job on purpose.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

// LongJob begins the skip message of a test that a long job runs.
const LongJob = "long job: "

type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

func main() {
	out := bufio.NewWriter(os.Stdout)
	code := report(bufio.NewReader(os.Stdin), out, os.Getenv("CAIRN_FAIL_ON_SKIP") == "1")
	out.Flush()
	os.Exit(code)
}

func report(in *bufio.Reader, w *bufio.Writer, failOnSkip bool) int {
	outputs := map[string][]string{} // package + "\x00" + test -> output lines
	var skipped, long []string
	passed, failed := 0, 0
	pkgFailed := false
	s := bufio.NewScanner(in)
	s.Buffer(make([]byte, 1<<20), 64<<20)
	for s.Scan() {
		var e event
		if err := json.Unmarshal(s.Bytes(), &e); err != nil || e.Action == "" {
			// Not an event (go vet or build messages): show it as is.
			fmt.Fprintln(w, s.Text())
			continue
		}
		key := e.Package + "\x00" + e.Test
		switch e.Action {
		case "output", "build-output":
			outputs[key] = append(outputs[key], e.Output)
		case "pass":
			if e.Test != "" {
				passed++
			} else {
				fmt.Fprintf(w, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
			}
			delete(outputs, key)
		case "skip":
			if r := reason(outputs[key]); e.Test != "" && strings.Contains(r, LongJob) {
				long = append(long, fmt.Sprintf("%s %s: %s", e.Package, e.Test, r))
			} else if e.Test != "" {
				skipped = append(skipped, fmt.Sprintf("%s %s: %s", e.Package, e.Test, r))
			} else {
				fmt.Fprintf(w, "?   \t%s\t[no test files]\n", e.Package)
			}
			delete(outputs, key)
		case "fail":
			if e.Test != "" {
				failed++
				for _, l := range outputs[key] {
					fmt.Fprint(w, l)
				}
			} else {
				pkgFailed = true
				for _, l := range outputs[key] {
					if !strings.HasPrefix(l, "=== ") {
						fmt.Fprint(w, l)
					}
				}
				fmt.Fprintf(w, "FAIL\t%s\n", e.Package)
			}
			delete(outputs, key)
		}
		w.Flush()
	}
	sort.Strings(long)
	for _, l := range long {
		fmt.Fprintln(w, "LONG", l)
	}
	sort.Strings(skipped)
	for _, l := range skipped {
		fmt.Fprintln(w, "SKIP", l)
	}
	code := 0
	if failed > 0 || pkgFailed {
		code = 1
	}
	last := fmt.Sprintf("tests: %d passed, %d failed, %d skipped", passed, failed, len(skipped))
	if len(long) > 0 {
		last += fmt.Sprintf(", %d left to long jobs", len(long))
	}
	if len(skipped) > 0 && failOnSkip {
		last += " (CAIRN_FAIL_ON_SKIP=1: a skip fails the run)"
		code = 1
	}
	fmt.Fprintln(w, last)
	return code
}

// reason is the last line a skipped test printed (t.Skip's message).
func reason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.HasPrefix(l, "--- SKIP") && !strings.HasPrefix(l, "=== ") {
			return l
		}
	}
	return "(no reason given)"
}
