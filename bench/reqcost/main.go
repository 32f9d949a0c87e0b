// Command reqcost times the cost of one FUSE request: each of T threads
// opens FILE and calls fstat on it N times. On a mount whose attribute
// timeout is zero every fstat is one GETATTR round trip to the server, so
// the time per call is the request's cost (on native ext4, the floor of
// the system call itself). It prints the nanoseconds per call, all threads
// together (wall time / calls) and per thread (a call's latency).
//
// Usage: reqcost [-n N] [-threads T] FILE
package main

import (
	"flag"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

func main() {
	n := flag.Int("n", 20000, "fstat calls per thread")
	threads := flag.Int("threads", 1, "threads, each with its own descriptor")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: reqcost [-n N] [-threads T] FILE")
		os.Exit(2)
	}
	fds := make([]int, *threads)
	for i := range fds {
		fd, err := syscall.Open(flag.Arg(0), syscall.O_RDONLY, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "reqcost:", err)
			os.Exit(1)
		}
		fds[i] = fd
	}
	var wg sync.WaitGroup
	errs := make(chan error, *threads)
	start := time.Now()
	for _, fd := range fds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st syscall.Stat_t
			for range *n {
				if err := syscall.Fstat(fd, &st); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		fmt.Fprintln(os.Stderr, "reqcost: fstat:", err)
		os.Exit(1)
	}
	calls := float64(*n * *threads)
	fmt.Printf("%.0f %.0f\n", float64(el.Nanoseconds())/calls, float64(el.Nanoseconds())/float64(*n))
}
