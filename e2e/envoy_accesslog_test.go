package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// Who is limited, and why, in real Envoy with two workers, for both artifacts: 10,000
// background keys (one request each), then 5 abusive keys (40 each, 20 over their limit).
// Envoy's JSON access log carries sluice's decision (filter state for sluice.wasm, dynamic
// metadata for libsluice.so): every refused request names the rule, the decision and its
// key; each refusal names its rule in a header and has a problem-details body; the top keys
// log line of the denials names the 5 abusive keys.
const accessLogConfig = `{"rules":[{"name":"per-key","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":20,"window":"1h"}],
 "access_log":{"key":"raw"},
 "top_keys":{"size":64,"key":"raw","log_every":"5s","log_top":5},
 "response":{"rule_header":"x-sluice-rule","format":"problem_json"}}`

const (
	accessLogBackground = 10_000
	accessLogAbusers    = 5
	accessLogAbuse      = 40
	accessLogLimit      = 20
)

func TestEnvoyAccessLogDecisions(t *testing.T) {
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		logPath := filepath.Join(t.TempDir(), "access.json")
		render := func(site EnvoySite) ([]byte, error) {
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "access-log", Config: accessLogConfig, CatchAll: true, AccessLogPath: logPath})
		}
		e := startEnvoyAs(t, tg, a, 2, render, "--component-log-level", "wasm:info,dynamic_modules:info")
		p := envoyProxy(t, e)
		refused := sendAccessLogTraffic(t, p.url)
		if refused != accessLogAbusers*(accessLogAbuse-accessLogLimit) {
			t.Fatalf("%d refusals, want %d", refused, accessLogAbusers*(accessLogAbuse-accessLogLimit))
		}
		checkAccessLog(t, logPath, refused)
		checkTopKeysLine(t, e, p.url)
		checkAccessLogHealthy(t, e, a)
	})
}

// sendAccessLogTraffic sends the background and abusive requests, interleaved, over 8
// connections, checks every answer, and returns the number of refusals.
func sendAccessLogTraffic(t *testing.T, url string) int {
	t.Helper()
	keys := make(chan string, 256)
	go func() {
		for i := 0; i < accessLogBackground; i++ {
			keys <- fmt.Sprintf("bg-%d", i)
		}
		// The abuse comes last, in a burst well within one 5 s period of top keys.
		for i := 0; i < accessLogAbusers*accessLogAbuse; i++ {
			keys <- fmt.Sprintf("abuser-%d", i%accessLogAbusers)
		}
		close(keys)
	}()
	var mu sync.Mutex
	refused := 0
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: 10 * time.Second}
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range keys {
				req, _ := http.NewRequest("GET", url+"/", nil)
				req.Header.Set("x-api-key", k)
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
				case 429:
					checkRefusal(t, k, resp, body)
					mu.Lock()
					refused++
					mu.Unlock()
				default:
					t.Errorf("key %s: status %d", k, resp.StatusCode)
				}
			}
		}()
	}
	wg.Wait()
	return refused
}

func checkRefusal(t *testing.T, key string, resp *http.Response, body []byte) {
	if !strings.HasPrefix(key, "abuser-") {
		t.Errorf("background key %s refused", key)
	}
	var pd map[string]any
	if resp.Header.Get("x-sluice-rule") != "per-key" || resp.Header.Get("content-type") != "application/problem+json" ||
		json.Unmarshal(body, &pd) != nil || pd["rule"] != "per-key" || pd["limit"] != float64(accessLogLimit) || pd["status"] != 429.0 {
		t.Errorf("refusal of %s: headers %v body %q", key, resp.Header, body)
	}
}

// checkAccessLog reads the access log (Envoy flushes it within a second: polled) until it
// has a line per request, and checks each refusal's line names the rule, the decision and
// the key, and no background request's line carries a decision.
func checkAccessLog(t *testing.T, path string, refused int) {
	t.Helper()
	want := accessLogBackground + accessLogAbusers*accessLogAbuse
	var lines []map[string]any
	deadline := time.Now().Add(30 * time.Second)
	for {
		lines = readJSONLines(t, path)
		if len(lines) >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(lines) != want {
		t.Fatalf("access log has %d lines, want %d", len(lines), want)
	}
	denied, near := 0, 0
	for _, l := range lines {
		key, _ := l["api_key"].(string)
		switch {
		case l["status"] == 429.0:
			denied++
			if l["rule"] != "per-key" || l["decision"] != "denied" || l["key"] != key || l["remaining"] != "0" || l["limit"] != "20" {
				t.Fatalf("refused request's line: %v", l)
			}
		case l["decision"] == "near_limit":
			near++
			if !strings.HasPrefix(key, "abuser-") {
				t.Fatalf("near-limit line for %s: %v", key, l)
			}
		case l["decision"] != nil:
			t.Fatalf("admitted request's line: %v", l)
		}
	}
	// Each abuser's 18th to 20th admissions leave at most 10% of 20 (2).
	if denied != refused || near != accessLogAbusers*3 {
		t.Fatalf("access log: %d denied lines (%d refused), %d near_limit (want %d)", denied, refused, near, accessLogAbusers*3)
	}
}

func readJSONLines(t *testing.T, path string) []map[string]any {
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			continue // a line still being written
		}
		out = append(out, m)
	}
	return out
}

var topDeniedLine = regexp.MustCompile(`sluice: top keys: rule per-key denied over [^:]*: total (\d+), error <= (\d+):((?: \S+=\d+)+)`)

// checkTopKeysLine waits for the log line of a finished period of denials: a period ends
// when a worker merges denials after it (the line is written then), so an abuser keeps
// asking, once per 100 ms on a new connection (each worker merges what it holds at its
// first request a second after its last merge), until the line is there. The period of
// the burst must name the 5 abusers.
func checkTopKeysLine(t *testing.T, e *envoyproc.Envoy, url string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range topDeniedLine.FindAllStringSubmatch(e.Log(), -1) {
			if m[1] == "1" {
				continue // the period of one keep-alive denial
			}
			for i := 0; i < accessLogAbusers; i++ {
				if !strings.Contains(m[3], fmt.Sprintf(" abuser-%d=", i)) {
					t.Fatalf("top keys line %q lacks abuser-%d", m[0], i)
				}
			}
			return
		}
		req, _ := http.NewRequest("GET", url+"/", nil)
		req.Header.Set("x-api-key", "abuser-0")
		req.Close = true
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no top keys line naming the abusers in Envoy's log")
}

// checkAccessLogHealthy is checkHealthyAs without counting the top keys lines (info lines
// of the guest) as failures.
func checkAccessLogHealthy(t *testing.T, e *envoyproc.Envoy, a artifact) {
	t.Helper()
	var signals, lines []string
	if a.dynmod {
		signals, lines = dynmodFailureSignals(e)
	} else {
		signals, lines = envoyFailureSignals(e, 2)
	}
	bad := 0
	for _, l := range lines {
		if !strings.Contains(l, "sluice: top keys:") {
			bad++
			t.Errorf("envoy log: %s", l)
		}
	}
	for _, s := range signals {
		if !strings.HasSuffix(s, "failure lines in the log") || bad > 0 {
			t.Errorf("envoy shows a failure: %s", s)
		}
	}
}
