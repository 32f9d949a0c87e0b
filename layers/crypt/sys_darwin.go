package crypt

// adviseNoDump: macOS has no MADV_DONTDUMP (and no core: protectProcess).
func adviseNoDump(b []byte) {}

// adviseSequential: macOS reads ahead by itself (F_RDAHEAD is on).
func adviseSequential(fd int) {}
