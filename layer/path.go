package layer

import "strings"

// Join joins a directory path and a name ("" is the root).
func Join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// Split splits a path into its directory and its last name.
func Split(path string) (dir, name string) {
	i := strings.LastIndexByte(path, '/')
	if i < 0 {
		return "", path
	}
	return path[:i], path[i+1:]
}

// ValidName reports whether name can be one component of a path.
func ValidName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\x00")
}

// Clean turns a slash path from a user ("/a/b/", "a//b") into the layer form
// ("a/b"). It returns false for paths with "." or ".." components.
func Clean(p string) (string, bool) {
	var parts []string
	for _, s := range strings.Split(p, "/") {
		switch s {
		case "":
			continue
		case ".", "..":
			return "", false
		}
		if strings.IndexByte(s, 0) >= 0 {
			return "", false
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "/"), true
}
