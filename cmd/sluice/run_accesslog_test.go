package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/host"
)

// A line is one JSON object: the fixed fields, the filter's sluice.* values at the top
// level, anything else (and a sluice.* name that would hide a fixed field) under
// filter_state; control characters and invalid UTF-8 stay valid JSON.
func TestAccessLogLine(t *testing.T) {
	start := time.Date(2030, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
	e := host.AccessLogEntry{
		Start: start, Duration: 1500 * time.Microsecond, Method: "GET", Path: "/a?b=\"c\"\n", Authority: "api",
		Protocol: "HTTP/1.1", RemoteAddr: "10.0.0.1:5", Status: 429, BodyBytes: 12, Details: "sluice_rate_limited",
		FilterState: []host.FilterState{{Name: "sluice.rule", Value: "per-key"}, {Name: "sluice.decision", Value: "denied"},
			{Name: "sluice.key", Value: "k\xff"}, {Name: "sluice.status", Value: "x"}, {Name: "other.thing", Value: "1"}},
	}
	line := appendAccessLine(nil, e)
	if !bytes.HasSuffix(line, []byte("}\n")) || bytes.Count(line, []byte("\n")) != 1 {
		t.Fatalf("not one line: %q", line)
	}
	var got map[string]any
	if err := json.Unmarshal(line, &got); err != nil {
		t.Fatalf("%v: %s", err, line)
	}
	want := map[string]any{
		"time": "2030-01-02T03:04:05.6Z", "method": "GET", "path": "/a?b=\"c\"\n", "authority": "api", "protocol": "HTTP/1.1",
		"remote": "10.0.0.1:5", "status": 429.0, "bytes": 12.0, "duration_ms": 1.5, "details": "sluice_rate_limited",
		"rule": "per-key", "decision": "denied", "key": "k\ufffd",
		"filter_state": map[string]any{"sluice.status": "x", "other.thing": "1"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("line %s\ngot  %v\nwant %v", line, got, want)
	}
	// A request the filter wrote nothing for: no decision fields, no details.
	line = appendAccessLine(nil, host.AccessLogEntry{Start: start, Method: "GET", Path: "/", Status: 200})
	if strings.Contains(string(line), "rule") || strings.Contains(string(line), "details") || strings.Contains(string(line), "filter_state") {
		t.Errorf("plain line %s", line)
	}
}

// --access-log names a file that cannot be opened: sluice run refuses to start, saying so.
func TestRunAccessLogUnwritable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	dir := t.TempDir()
	bad := filepath.Join(dir, "no-such-dir", "access.json")
	wasm := filepath.Join(dir, "empty.wasm") // an empty module: the flag fails before it is compiled
	os.WriteFile(wasm, []byte("\x00asm\x01\x00\x00\x00"), 0o644)
	code := runRun([]string{"--access-log", bad, "--wasm", wasm, "--listen", "127.0.0.1:0", "--cache-dir", ""}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "--access-log: open "+bad) {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	if _, err := os.Stat(filepath.Dir(bad)); !os.IsNotExist(err) {
		t.Errorf("the directory was created")
	}
}

// Lines written from many requests at once stay whole, and close writes out what the buffer
// holds; a request after close is not logged.
func TestAccessLoggerConcurrentAndClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.json")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	l := newAccessLogger(f, time.Hour) // only close writes it out
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				l.write(host.AccessLogEntry{Method: "GET", Path: "/" + strings.Repeat("x", i%300), Status: 200,
					FilterState: []host.FilterState{{Name: "sluice.rule", Value: "r"}}})
			}
		}()
	}
	wg.Wait()
	l.close()
	l.write(host.AccessLogEntry{Method: "GET", Path: "/late"})
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 8*500 {
		t.Fatalf("%d lines, want %d", len(lines), 8*500)
	}
	for _, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil || m["rule"] != "r" {
			t.Fatalf("line %q: %v", line, err)
		}
	}
}
