package codec

import (
	"fmt"
	"os"
	"sync"
)

var traceMu sync.Mutex
var traceF = func() *os.File {
	if p := os.Getenv("CODEC_TRACE"); p != "" {
		f, _ := os.Create(p)
		return f
	}
	return nil
}()

func trace(f string, a ...any) {
	if traceF == nil {
		return
	}
	traceMu.Lock()
	fmt.Fprintf(traceF, f+"\n", a...)
	traceMu.Unlock()
}
