// Package cephtest gives tests directories on a CephFS file system: a
// throwaway single-node Ceph cluster of this host (test/ceph.sh: a monitor,
// a manager, one OSD on a file, an MDS and the file system "cephfs", in a
// temporary directory and a network namespace of their own), started by the
// first test that asks and stopped when the test binary ends (Main), and
// ceph-fuse client mounts of the file system, one per call, as separate
// machines would have them.
//
// The cluster takes 10-20 s to start and about 1 GiB, so its tests are a
// long job: they run only with CAIRN_CEPH=1 (./test.sh --ceph) and skip
// otherwise, saying so. With CAIRN_CEPH=1 a cluster that cannot start, or a
// missing Ceph, fails the test.
package cephtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/dfstest"
	"cairnfs.dev/cairn/internal/mounttest"
)

// Enabled says whether the CephFS tests run (CAIRN_CEPH=1).
func Enabled() bool { return os.Getenv("CAIRN_CEPH") == "1" }

var cluster = &dfstest.Cluster{Name: "Ceph", Script: "test/ceph.sh", Up: "up", Down: "down"}

// Main runs the tests and then stops the cluster, if one was started:
// func TestMain(m *testing.M) { cephtest.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops the cluster (every client mount and every daemon) and removes
// its directory. Main calls it.
func Stop() { cluster.Stop() }

// Need skips the test unless CAIRN_CEPH=1; then it fails the test when Ceph
// is not installed or the test does not run as root.
func Need(t testing.TB) {
	t.Helper()
	if !Enabled() {
		// internal/testreport counts a skip that begins so apart.
		t.Skip("long job: the CephFS suites start a Ceph cluster (10-20 s, 1 GiB); run them with ./test.sh --ceph " +
			"(or CAIRN_CEPH=1 go test ./internal/cephtest after test/ceph.sh install)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("CAIRN_CEPH=1: the CephFS tests need root (the cluster's network namespace, ceph-fuse mounts)")
	}
	mounttest.Need(t)
	for _, c := range []string{"ceph-mon", "ceph-mgr", "ceph-osd", "ceph-mds", "ceph-fuse", "ceph", "ceph-authtool", "monmaptool"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Fatalf("CAIRN_CEPH=1 but Ceph is not installed (no %s): test/ceph.sh install", c)
		}
	}
}

// start starts the cluster once per test binary.
func start(t testing.TB) (dir, script string) {
	t.Helper()
	Need(t)
	return cluster.Start(t)
}

// Shared are the ceph-fuse options for a lower that other clients change:
// no kernel page cache. ceph-fuse drops a file's pages when the MDS takes
// its caching caps back, but does so in the background: a read right after
// another client's close and this one's open can still get the old pages
// (wrong bytes in close-to-open through a null stack, whose reads go
// straight to the ceph-fuse file: docs/distributed.md).
var Shared = []string{"--fuse_disable_pagecache=true"}

// Mount mounts the file system with a new ceph-fuse client on a new
// directory and returns it; the client is unmounted when the test ends. Two
// calls give two clients, each with its own caches and capabilities, as two
// machines would have. opts are more options of ceph-fuse.
func Mount(t testing.TB, opts ...string) string {
	t.Helper()
	dir, script := start(t)
	mnt := filepath.Join(dir, "clients", fmt.Sprintf("c%d", dfstest.Next()))
	cmd := exec.Command(script, "mount", dir, mnt)
	cmd.Env = append(os.Environ(), "CAIRN_CEPH_CLIENT_OPTS="+strings.Join(opts, " "))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("test/ceph.sh mount: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(script, "umount", dir, mnt).CombinedOutput(); err != nil {
			t.Errorf("test/ceph.sh umount %s: %v\n%s", mnt, err, out)
		}
	})
	return mnt
}

// Dir returns a new, empty directory on the file system through a new
// client mount: each test's files apart from the others'.
func Dir(t testing.TB) string {
	t.Helper()
	d := filepath.Join(Mount(t), fmt.Sprintf("%s-%d", dfstest.Sanitize(t.Name()), dfstest.Next()))
	if err := os.Mkdir(d, 0o777); err != nil {
		t.Fatal(err)
	}
	return d
}
