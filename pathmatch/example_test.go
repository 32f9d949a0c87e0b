package pathmatch_test

import (
	"fmt"

	"cairnfs.dev/cairn/pathmatch"
)

func Example() {
	logs, _ := pathmatch.NewSet([]string{"*.log", "/cache/"}, []string{"cache/keep/**"})
	for _, p := range []string{"a.log", "x/y/b.log", "cache", "cache/a/b", "cache/keep/c", "notes.txt"} {
		fmt.Println(p, logs.Contains(p))
	}
	// Output:
	// a.log true
	// x/y/b.log true
	// cache true
	// cache/a/b true
	// cache/keep/c false
	// notes.txt false
}
