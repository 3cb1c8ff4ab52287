package host

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The test guests are compiled once per test binary run, into a temporary directory.
var (
	guestDir  string
	guestMu   sync.Mutex
	guestWasm = map[string][]byte{}
	guestErr  = map[string]error{}
)

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "sluice-host-guests-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	guestDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

// guest returns the compiled test guest testdata/guests/<name>.
func guest(tb testing.TB, name string) []byte {
	tb.Helper()
	if testing.Short() {
		tb.Skip("builds test guest " + name + " (go build, GOOS=wasip1): not under -short")
	}
	guestMu.Lock()
	defer guestMu.Unlock()
	if b, ok := guestWasm[name]; ok {
		return b
	}
	if err, ok := guestErr[name]; ok {
		tb.Fatal(err)
	}
	out := filepath.Join(guestDir, name+".wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, ".")
	cmd.Dir = filepath.Join("testdata", "guests", name)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if msg, err := cmd.CombinedOutput(); err != nil {
		guestErr[name] = fmt.Errorf("building guest %s: %v\n%s", name, err, msg)
		tb.Fatal(guestErr[name])
	}
	b, err := os.ReadFile(out)
	if err != nil {
		tb.Fatal(err)
	}
	guestWasm[name] = b
	return b
}

// logBuffer collects log output for assertions. Safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) count(s string) int { return strings.Count(l.String(), s) }

// newHost starts a host for a test guest and closes it when the test ends.
func newHost(tb testing.TB, name string, opts Options) (*Host, *logBuffer) {
	tb.Helper()
	opts.Wasm = guest(tb, name)
	logs := &logBuffer{}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug - 4}))
	}
	if opts.Workers == 0 {
		opts.Workers = 2
	}
	ctx := context.Background()
	h, err := New(ctx, opts)
	if err != nil {
		tb.Fatalf("New: %v\nlogs:\n%s", err, logs)
	}
	tb.Cleanup(func() { h.Close(ctx) })
	return h, logs
}

func testCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func newTestLogger(w *logBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug - 4}))
}
