package rls

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// scripted is a Backend answering what the test says.
type scripted struct {
	mu    sync.Mutex
	reply []byte
	err   error
	calls int
}

func (s *scripted) Do(context.Context, []byte) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return s.reply, s.err
}

func (s *scripted) set(reply string, err error) {
	s.mu.Lock()
	s.reply, s.err = []byte(reply), err
	s.mu.Unlock()
}

// Redis refusing commands: logged with the error and the node, at most once per LogEvery
// for one error and node; not ready once every call failed for FailFor; ready again at the
// first success; counted by outcome.
func TestWatchLogsRefusalsAndReportsReadiness(t *testing.T) {
	b := &scripted{}
	var logs bytes.Buffer
	var changes []string
	w := NewWatch(b, func([]byte) string { return "10.0.0.7:6379" }, slog.New(slog.NewTextHandler(&logs, nil)),
		func(ready bool, why string) {
			changes = append(changes, strings.TrimSpace(map[bool]string{true: "ready", false: "not ready " + why}[ready]))
		})
	now := time.Unix(1_700_000_000, 0)
	w.now = func() time.Time { return now }
	ctx := context.Background()

	b.set("+OK\r\n", nil)
	w.Do(ctx, []byte("x"))
	b.set("-OOM command not allowed when used memory > 'maxmemory'.\r\n", nil)
	for i := 0; i < 50; i++ {
		if _, err := w.Do(ctx, []byte("x")); err != nil {
			t.Fatalf("an error reply is a reply: %v", err)
		}
		now = now.Add(30 * time.Millisecond)
	}
	if w.Ready() {
		t.Fatal("ready after 1.5 s of refusals")
	}
	if n := strings.Count(logs.String(), "Redis call failed"); n != 1 {
		t.Errorf("%d log lines for 50 refusals within 10 s, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), `error="OOM command not allowed`) || !strings.Contains(logs.String(), "node=10.0.0.7:6379") {
		t.Errorf("log lacks the error or the node:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "not ready: Redis cannot decide") {
		t.Errorf("no log line for the readiness change:\n%s", logs.String())
	}
	// Another error is its own line; the same one again after LogEvery says how many were not logged.
	b.set("-NOAUTH Authentication required.\r\n", nil)
	w.Do(ctx, []byte("x"))
	now = now.Add(10 * time.Second)
	b.set("-OOM command not allowed when used memory > 'maxmemory'.\r\n", nil)
	w.Do(ctx, []byte("x"))
	if !strings.Contains(logs.String(), `error="NOAUTH Authentication required."`) || !strings.Contains(logs.String(), "suppressed_since_last=49") {
		t.Errorf("log:\n%s", logs.String())
	}
	b.set("", errors.New("redis: timeout"))
	w.Do(ctx, []byte("x"))
	b.set(":1\r\n", nil)
	w.Do(ctx, []byte("x"))
	if !w.Ready() {
		t.Fatal("not ready after a success")
	}
	if got := strings.Join(changes, ","); got != "not ready error reply: OOM command not allowed when used memory > 'maxmemory'.,ready" {
		t.Errorf("changes %q", got)
	}
	var m bytes.Buffer
	w.WritePrometheus(&m)
	for _, want := range []string{`sluice_redis_calls_total{outcome="ok"} 2`, `sluice_redis_calls_total{outcome="error_reply"} 52`,
		`sluice_redis_calls_total{outcome="timeout"} 1`, `sluice_redis_calls_total{outcome="no_reply"} 0`, "sluice_ready 1"} {
		if !strings.Contains(m.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, m.String())
		}
	}
}

// A few failures among successes keep the service ready; NOSCRIPT is an answer.
func TestWatchStaysReadyWhileSomeCallsSucceed(t *testing.T) {
	b := &scripted{}
	w := NewWatch(b, nil, nil, nil)
	now := time.Unix(1_700_000_000, 0)
	w.now = func() time.Time { return now }
	for i := 0; i < 100; i++ {
		switch i % 3 {
		case 0:
			b.set("", errors.New("redis: network error"))
		case 1:
			b.set("-NOSCRIPT No matching script.\r\n", nil)
		default:
			b.set("*1\r\n:1\r\n", nil)
		}
		w.Do(context.Background(), nil)
		now = now.Add(100 * time.Millisecond)
	}
	if !w.Ready() {
		t.Error("not ready although two calls in three succeed")
	}
}

// With no traffic, the probe finds Redis back (and gone): readiness follows without calls.
func TestWatchProbeRestoresReadiness(t *testing.T) {
	b := &scripted{}
	b.set("-CLUSTERDOWN The cluster is down\r\n", nil)
	w := NewWatch(b, nil, nil, nil)
	w.FailFor, w.ProbeEvery = 50*time.Millisecond, 10*time.Millisecond
	w.Start()
	defer w.Stop()
	waitFor(t, func() bool { return !w.Ready() }, "not ready while the probe is refused")
	b.set("+OK\r\n", nil)
	waitFor(t, w.Ready, "ready once the probe succeeds")
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
