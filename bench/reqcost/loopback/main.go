// Command loopback is go-fuse's own loopback file system (upstream
// go-fuse, not cairn's copy), with the kernel's caches of names and
// attributes off, so that bench/reqcost.sh can time one go-fuse request
// with nothing of cairn in it.
//
// Usage: loopback LOWER MOUNTPOINT (stays in the foreground)
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: loopback LOWER MOUNTPOINT")
		os.Exit(2)
	}
	root, err := fs.NewLoopbackRoot(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	zero := time.Duration(0)
	srv, err := fs.Mount(os.Args[2], root, &fs.Options{
		AttrTimeout:  &zero,
		EntryTimeout: &zero,
		MountOptions: fuse.MountOptions{FsName: "gofuse-loopback", Name: "loopback", DirectMount: true},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		srv.Unmount()
	}()
	srv.Wait()
}
