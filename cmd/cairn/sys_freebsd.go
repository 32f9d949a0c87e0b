package main

import "fmt"

// exchange: FreeBSD has no atomic exchange of two names; cairn init of an
// existing directory leaves both for the operator to swap.
func exchange(a, b string) error {
	return fmt.Errorf("FreeBSD cannot exchange two names in one step: the converted tree is %s; move it in place of %s by hand", a, b)
}
