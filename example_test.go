package cairn_test

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"cairnfs.dev/cairn"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/layers/local"
)

// A zstd stack over a directory, in-process: write, read back, walk.
func Example() {
	dir, _ := os.MkdirTemp("", "cairn-example")
	defer os.RemoveAll(dir)

	s, err := cairn.Open("zstd:"+dir, cairn.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	if err := s.MkdirAll("notes/2026", 0o755); err != nil {
		log.Fatal(err)
	}
	if err := s.WriteFile("notes/2026/today.txt", []byte("compressed at rest\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	b, err := s.ReadFile("notes/2026/today.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(b))
	fs.WalkDir(s.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fmt.Println(p, d.IsDir())
		return nil
	})
	// Output:
	// compressed at rest
	// . true
	// notes true
	// notes/2026 true
	// notes/2026/today.txt false
}

// An encrypted volume served read-only over HTTP with http.FileServerFS.
func Example_http() {
	dir, _ := os.MkdirTemp("", "cairn-example")
	defer os.RemoveAll(dir)
	pass := []byte("correct horse battery staple")

	// What 'cairn init crypt:DIR' does (a cheap key derivation for the
	// example; the default is argon2id at 64 MiB).
	l, _ := local.New(dir)
	if _, err := crypt.Init(context.Background(), l, crypt.InitParams{KDF: crypt.KDF{Name: crypt.Scrypt, N: crypt.ScryptMinN, R: 8, P: 1}}, pass); err != nil {
		log.Fatal(err)
	}
	l.Close()

	s, err := cairn.Open("crypt:"+dir, cairn.Options{Secrets: map[string][]byte{"crypt": pass}})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	s.WriteFile("index.html", []byte("<p>served from an encrypted volume</p>\n"), 0o644)

	srv := httptest.NewServer(http.FileServerFS(s.FS()))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/index.html")
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Print(string(body))

	// The lower holds no plaintext name.
	_, err = os.Stat(filepath.Join(dir, "index.html"))
	fmt.Println(os.IsNotExist(err))
	// Output:
	// <p>served from an encrypted volume</p>
	// true
}
