package main

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
)

const stream = `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.1}
{"Action":"output","Package":"p","Test":"TestB","Output":"    x_test.go:9: no FUSE here\n"}
{"Action":"output","Package":"p","Test":"TestB","Output":"--- SKIP: TestB (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestB"}
{"Action":"pass","Package":"p","Elapsed":0.5}
{"Action":"output","Package":"q","Test":"TestC","Output":"    y_test.go:3: wrong bytes\n"}
{"Action":"fail","Package":"q","Test":"TestC"}
{"Action":"output","Package":"q","Output":"FAIL\n"}
{"Action":"fail","Package":"q","Elapsed":0.2}
`

func run(t *testing.T, in string, failOnSkip bool) (string, int) {
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	code := report(bufio.NewReader(strings.NewReader(in)), w, failOnSkip)
	w.Flush()
	return b.String(), code
}

func TestReport(t *testing.T) {
	out, code := run(t, stream, false)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 1 || lines[len(lines)-1] != "tests: 1 passed, 1 failed, 1 skipped" {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
	for _, want := range []string{"ok  \tp\t0.500s", "wrong bytes", "FAIL\tq", "SKIP p TestB: x_test.go:9: no FUSE here"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Without the failure, a skip passes unless CAIRN_FAIL_ON_SKIP.
	ok := stream[:strings.Index(stream, `{"Action":"output","Package":"q"`)]
	if out, code := run(t, ok, false); code != 0 || !strings.HasSuffix(out, "tests: 1 passed, 0 failed, 1 skipped\n") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if out, code := run(t, ok, true); code != 1 || !strings.Contains(out, "1 skipped (CAIRN_FAIL_ON_SKIP=1") {
		t.Fatalf("fail on skip: exit %d:\n%s", code, out)
	}
}

// A skip that says a long job runs the test is listed apart and does not
// fail CAIRN_FAIL_ON_SKIP; other skips still do.
func TestLongJob(t *testing.T) {
	in := `{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.1}
{"Action":"output","Package":"p","Test":"TestCeph","Output":"    cephtest.go:9: long job: the CephFS suites run with ./test.sh --ceph\n"}
{"Action":"output","Package":"p","Test":"TestCeph","Output":"--- SKIP: TestCeph (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestCeph"}
{"Action":"pass","Package":"p","Elapsed":0.5}
`
	out, code := run(t, in, true)
	if code != 0 || !strings.HasSuffix(out, "tests: 1 passed, 0 failed, 0 skipped, 1 left to long jobs\n") ||
		!strings.Contains(out, "LONG p TestCeph: cephtest.go:9: long job: the CephFS suites run with ./test.sh --ceph") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if out, code := run(t, in+stream[strings.Index(stream, `{"Action":"output","Package":"p","Test":"TestB"`):strings.Index(stream, `{"Action":"pass","Package":"p","Elapsed"`)], true); code != 1 ||
		!strings.Contains(out, "1 skipped, 1 left to long jobs (CAIRN_FAIL_ON_SKIP=1") {
		t.Fatalf("a plain skip with a long job's: exit %d:\n%s", code, out)
	}
}
