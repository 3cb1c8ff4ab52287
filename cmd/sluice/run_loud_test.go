package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/config"
)

// A rule whose remote backend names a service the command line does not give: `sluice run`
// refuses to start with one line naming the flag to add.
func TestRunRefusesMissingServices(t *testing.T) {
	const rls = `{"rules":[{"name":"api","key":[{"header":"x-api-key"}],"algorithm":"sliding_window","limit":100,"window":"1m","backend":"rls"}],
"rls":{"cluster":"rls","domain":"mesh"}}`
	const redis = `{"rules":[{"name":"api","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":5,"window":"1m","backend":"redis"}],
"redis":{"cluster":"outbound|6379||redis.default.svc.cluster.local"}}`
	const scoped = `{"_rules_":[{"_match_route_":["a"],"rules":[{"name":"inner","key":[{"header":"k"}],"algorithm":"fixed_window","limit":5,"window":"1m","backend":"rls"}],
"rls":{"cluster":"svc","domain":"mesh"}}]}`
	const local = `{"rules":[{"name":"l","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":5,"window":"10s"}]}`
	for _, tc := range []struct {
		name, config string
		build        config.Build
		clusters     map[string]string
		redis        map[string][]string
		want         string // "" : no error
	}{
		{"rls without --cluster", rls, config.BuildLocal, nil, nil,
			`rule "api" uses backend "rls" on cluster "rls", which no --cluster gives: add --cluster rls=http://HOST:PORT`},
		{"rls with another --cluster", rls, config.BuildRedis, map[string]string{"other": "http://x:1"}, nil,
			`which no --cluster gives: add --cluster rls=http://HOST:PORT`},
		{"rls with its --cluster", rls, config.BuildLocal, map[string]string{"rls": "http://x:1"}, nil, ""},
		{"redis without --redis-cluster", redis, config.BuildRedis, map[string]string{"rls": "http://x:1"}, nil,
			`rule "api" uses backend "redis" on Redis cluster "outbound|6379||redis.default.svc.cluster.local", which no --redis-cluster gives: add --redis-cluster 'outbound|6379||redis.default.svc.cluster.local=HOST:PORT[,HOST:PORT...]'`},
		{"redis with its --redis-cluster", redis, config.BuildRedis, nil, map[string][]string{"outbound|6379||redis.default.svc.cluster.local": {"h:1"}}, ""},
		{"redis in sluice.wasm: the filter refuses it", redis, config.BuildLocal, nil, nil, ""},
		{"a _rules_ entry", scoped, config.BuildLocal, nil, nil, `rule "inner" (in _rules_ entry "rules_0") uses backend "rls" on cluster "svc"`},
		{"local rules", local, config.BuildLocal, nil, nil, ""},
		{"not a sluice configuration", "from-file", config.BuildLocal, nil, nil, ""},
	} {
		err := missingServices([]byte(tc.config), tc.build, tc.clusters, tc.redis)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}

	// The command: exit 1, that line alone on stderr, nothing served.
	cfg := writeFile(t, "rls.json", rls)
	var out, errOut bytes.Buffer
	code := dispatch([]string{"run", "--wasm", buildWasm(t, "../sluice-wasm"), "--config", cfg, "--listen", "127.0.0.1:0", "--workers", "1", "--cache-dir", ""}, &out, &errOut)
	want := `sluice run: rule "api" uses backend "rls" on cluster "rls", which no --cluster gives: add --cluster rls=http://HOST:PORT` + "\n"
	if code != 1 || errOut.String() != want || out.Len() != 0 {
		t.Errorf("sluice run with an rls rule and no --cluster: %d\nstdout %q\nstderr %q", code, out.String(), errOut.String())
	}
}

// A configuration the filter refuses is printed once, as `sluice check` prints it: not
// again by each worker's VM.
func TestRunRefusedConfigPrintedOnce(t *testing.T) {
	cfg := writeFile(t, "bad.json", `{"rules":[{"name":"a","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":0,"window":"10x"}]}`)
	var out, errOut bytes.Buffer
	code := dispatch([]string{"run", "--wasm", buildWasm(t, "../sluice-wasm"), "--config", cfg, "--listen", "127.0.0.1:0", "--workers", "3", "--cache-dir", ""}, &out, &errOut)
	if code != 1 {
		t.Fatalf("exit %d\n%s", code, errOut.String())
	}
	for _, s := range []string{`rules[0].window: "10x" is not a duration`, "rules[0].limit: 0 is out of range"} {
		if n := strings.Count(errOut.String(), s); n != 1 {
			t.Errorf("%q printed %d times:\n%s", s, n, errOut.String())
		}
	}
	if !strings.HasPrefix(errOut.String(), "sluice run: the filter ") || strings.Contains(errOut.String(), `\n`) || strings.Contains(errOut.String(), "level=") {
		t.Errorf("not the clean form alone:\n%s", errOut.String())
	}
}

// A stopped upstream: Envoy's 503 (or a trailers-only UNAVAILABLE to gRPC), the filter's
// response headers on it, and the cause logged once.
func TestRunUpstreamFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	for _, scheme := range []string{"http", "h2c"} {
		t.Run(scheme, func(t *testing.T) {
			rs, errOut := startLoggedRun(t, runConfig{wasm: buildWasm(t, "../sluice-wasm"), upstream: scheme + "://" + dead, workers: 1, clusters: clusterFlag{}, cacheDir: t.TempDir()})
			base := "http://" + rs.listenAddr
			const want = "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure"
			for range 3 {
				resp, body := httpGet(t, base+"/")
				if resp.StatusCode != 503 || body != want || resp.Header.Get("X-Ratelimit-Limit") != "5" {
					t.Fatalf("%d %q %v", resp.StatusCode, body, resp.Header)
				}
			}
			resp, body := h2cDo(t, "POST", base+"/pkg.Svc/M", "Content-Type", "application/grpc", "TE", "trailers")
			if resp.StatusCode != 200 || body != "" || resp.Header.Get("Grpc-Status") != "14" || resp.Header.Get("Grpc-Message") != want ||
				resp.Header.Get("Content-Type") != "application/grpc" {
				t.Errorf("gRPC: %d %q %v", resp.StatusCode, body, resp.Header)
			}
			if n := strings.Count(errOut.String(), "host: upstream request failed"); n != 1 {
				t.Errorf("%d failure lines for 4 failures within 10 s, want 1:\n%s", n, errOut)
			}
			for _, s := range []string{"upstream=" + scheme + "://" + dead, `reason="remote connection failure"`, "connection refused"} {
				if !strings.Contains(errOut.String(), s) {
					t.Errorf("the failure line lacks %q:\n%s", s, errOut)
				}
			}
		})
	}
}

// h2cDo sends one request over HTTP/2 cleartext with prior knowledge.
func h2cDo(t *testing.T, method, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(method, url, strings.NewReader("\x00\x00\x00\x00\x00"))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// snapshot returns the lines collected so far.
func (l *lineLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// count returns how many lines so far contain s.
func (l *lineLog) count(s string) int {
	n := 0
	for _, line := range l.snapshot() {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// statuses sends n requests with the key and returns their status codes in order.
func statuses(t *testing.T, addr, key string, n int) []int {
	t.Helper()
	var got []int
	for range n {
		resp, _ := httpGet(t, "http://"+addr+"/", "X-Api-Key", key)
		got = append(got, resp.StatusCode)
	}
	return got
}

func admittedThen429(got []int, admitted int) bool {
	for i, c := range got {
		if (i < admitted) != (c == 200) || (i >= admitted && c != 429) {
			return false
		}
	}
	return true
}

// SIGHUP reloads --config as `sluice serve` does: a new limit is in force, a bad file is
// refused (once, with the check's reason) and the previous configuration keeps serving, a
// configuration needing a missing service is refused too; SIGTERM still drains and exits 0.
// Every stderr line is one log record in one format.
func TestRunReloadsOnSIGHUP(t *testing.T) {
	cfg := writeFile(t, "sluice.json", `{"rules":[{"name":"per-key","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":2,"window":"1h"}]}`)
	p := startSluiceRun(t, "--wasm", buildWasm(t, "../sluice-wasm"), "--config", cfg, "--listen", "127.0.0.1:0", "--workers", "2", "--cache-dir", t.TempDir())
	if got := statuses(t, p.addr, "a", 3); !admittedThen429(got, 2) {
		t.Fatalf("limit 2: %v", got)
	}
	hup := func(wantLine string, n int) {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for p.stderr.count(wantLine) < n {
			if time.Now().After(deadline) {
				t.Fatalf("no %d lines %q:\n%s", n, wantLine, strings.Join(p.stderr.snapshot(), "\n"))
			}
			select {
			case err := <-p.exited:
				t.Fatalf("sluice run exited on SIGHUP: %v\n%s", err, strings.Join(p.stderr.snapshot(), "\n"))
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	os.WriteFile(cfg, []byte(`{"rules":[{"name":"per-key","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":4,"window":"1h"}]}`), 0o644)
	hup("SIGHUP: configuration reloaded", 1)
	if got := statuses(t, p.addr, "b", 5); !admittedThen429(got, 4) {
		t.Fatalf("limit 4 after SIGHUP: %v", got)
	}
	os.WriteFile(cfg, []byte(`{"rules":[{"name":"per-key","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":4,"window":"10x"}]}`), 0o644)
	hup("SIGHUP: configuration not reloaded; the previous one stays", 1)
	os.WriteFile(cfg, []byte(`{"rules":[{"name":"per-key","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":9,"window":"1h","backend":"rls"}],"rls":{"cluster":"rls","domain":"d"}}`), 0o644)
	hup("SIGHUP: configuration not reloaded; the previous one stays", 2)
	if got := statuses(t, p.addr, "c", 5); !admittedThen429(got, 4) {
		t.Fatalf("limit 4 kept after the refused reloads: %v", got)
	}
	if n := p.stderr.count(`\"10x\" is not a duration`); n != 1 {
		t.Errorf("the bad file's reason logged %d times, want 1:\n%s", n, strings.Join(p.stderr.snapshot(), "\n"))
	}
	if n := p.stderr.count("add --cluster rls=http://HOST:PORT"); n != 1 {
		t.Errorf("the missing service logged %d times, want 1:\n%s", n, strings.Join(p.stderr.snapshot(), "\n"))
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
	if p.stderr.count("sluice run: filter stopped") != 1 {
		t.Errorf("not drained:\n%s", strings.Join(p.stderr.snapshot(), "\n"))
	}
	record := regexp.MustCompile(`^time=\S+ level=(DEBUG|INFO|WARN|ERROR|CRITICAL) msg=`)
	for _, line := range p.stderr.snapshot() {
		if !record.MatchString(line) {
			t.Errorf("stderr line in another format: %q", line)
		}
	}
}

// SIGHUP without --config keeps the embedded default and says so.
func TestRunReloadWithoutConfigFile(t *testing.T) {
	rs, errOut := startLoggedRun(t, runConfig{wasm: buildWasm(t, "../sluice-wasm"), workers: 1, clusters: clusterFlag{}, cacheDir: t.TempDir()})
	if err := rs.reload(context.Background()); err != errNoConfigFile || !strings.Contains(errOut.String(), "no --config to reload") {
		t.Fatalf("%v\n%s", err, errOut)
	}
}

// The log's levels: the filter's critical is CRITICAL, not slog's ERROR+4.
func TestRunLoggerNamesCritical(t *testing.T) {
	var b bytes.Buffer
	l := newRunLogger(&b, slog.LevelInfo)
	l.Log(context.Background(), levelCritical, "c")
	l.Error("e")
	l.Debug("hidden")
	if got := b.String(); !strings.Contains(got, "level=CRITICAL msg=c\n") || !strings.Contains(got, "level=ERROR msg=e\n") || strings.Contains(got, "hidden") {
		t.Errorf("%s", got)
	}
}

// While held, records wait (in order, with their attributes); release writes them except
// the dropped ones, and later records pass straight through.
func TestHoldHandler(t *testing.T) {
	var mu sync.Mutex
	var b bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return b.Write(p) })
	st := &holdState{holding: true}
	l := slog.New(holdHandler{inner: slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug - 4}), st: st}).With("worker", 1)
	l.Info("one")
	l.Log(context.Background(), levelCritical, "refused")
	l.Warn("two")
	if b.Len() != 0 {
		t.Fatalf("written while held: %s", b.String())
	}
	st.release(func(r slog.Record) bool { return r.Level >= levelCritical })
	l.Info("three")
	st.release(nil)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "msg=one worker=1") || !strings.Contains(lines[1], "msg=two") || !strings.Contains(lines[2], "msg=three") {
		t.Errorf("%q", lines)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
