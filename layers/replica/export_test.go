package replica

// SetDebugCopy lets a test see each object resync copies.
func SetDebugCopy(fn func(k int, p string)) { debugCopy = fn }
