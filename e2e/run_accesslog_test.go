package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Who is limited, and why, through `sluice run --access-log`: the same traffic as in Envoy
// (10,000 background keys, 5 abusive ones 20 over their limit), and the host's access log
// has a line per request; every refusal's line names the rule, the decision and the
// abusive key, the admissions near the limit say so, no other line carries a decision;
// /status's top keys of the denials name the 5 abusers with their exact counts.
func TestRunAccessLogDecisions(t *testing.T) {
	dir := t.TempDir()
	cfg, logPath := filepath.Join(dir, "config.json"), filepath.Join(dir, "access.json")
	if err := os.WriteFile(cfg, []byte(accessLogConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := sluiceCmd(t, cfg, 2)
	cmd.Args = append(cmd.Args, "--access-log", logPath)
	p := startHostCmd(t, cmd)
	refused := sendAccessLogTraffic(t, p.url)
	if want := accessLogAbusers * (accessLogAbuse - accessLogLimit); refused != want {
		t.Fatalf("%d refusals, want %d", refused, want)
	}
	checkRunAccessLog(t, logPath, refused)
	checkRunTopKeys(t, p.admin)
}

// checkRunAccessLog polls the access log (flushed once a second) until it has a line per
// request, then checks every line.
func checkRunAccessLog(t *testing.T, path string, refused int) {
	t.Helper()
	want := accessLogBackground + accessLogAbusers*accessLogAbuse
	var lines []map[string]any
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		lines = readJSONLines(t, path)
		if len(lines) >= want || time.Now().After(deadline) {
			break
		}
	}
	if len(lines) != want {
		t.Fatalf("access log has %d lines, want %d", len(lines), want)
	}
	deniedBy := map[string]int{}
	near, admitted := 0, 0
	for _, l := range lines {
		if l["method"] != "GET" || l["path"] != "/" || l["time"] == nil || l["duration_ms"] == nil || l["protocol"] != "HTTP/1.1" {
			t.Fatalf("line lacks the request: %v", l)
		}
		key, _ := l["key"].(string)
		switch {
		case l["status"] == 429.0:
			if l["rule"] != "per-key" || l["decision"] != "denied" || !strings.HasPrefix(key, "abuser-") ||
				l["remaining"] != "0" || l["limit"] != "20" || l["details"] != "sluice_rate_limited" {
				t.Fatalf("refused request's line: %v", l)
			}
			deniedBy[key]++
		case l["status"] != 200.0:
			t.Fatalf("line with status %v: %v", l["status"], l)
		case l["decision"] == "near_limit":
			near++
			if l["rule"] != "per-key" || !strings.HasPrefix(key, "abuser-") {
				t.Fatalf("near-limit line: %v", l)
			}
		case l["decision"] != nil || l["rule"] != nil || l["key"] != nil:
			t.Fatalf("admitted request's line: %v", l)
		default:
			admitted++
		}
	}
	for i := 0; i < accessLogAbusers; i++ {
		if n := deniedBy[fmt.Sprintf("abuser-%d", i)]; n != accessLogAbuse-accessLogLimit {
			t.Errorf("abuser-%d: %d denied lines, want %d (%v)", i, n, accessLogAbuse-accessLogLimit, deniedBy)
		}
	}
	// Each abuser's 18th to 20th admissions leave at most 10% of 20 (2).
	if len(deniedBy) != accessLogAbusers || near != accessLogAbusers*3 || admitted != want-refused-near {
		t.Fatalf("access log: denied %v, %d near_limit (want %d), %d plain admissions", deniedBy, near, accessLogAbusers*3, admitted)
	}
}

// checkRunTopKeys polls /status until the denials merged into shared data (once a second
// per worker) name each abuser with its 20 refusals, over the current and the last period
// (the burst may straddle the end of a 5 s period).
func checkRunTopKeys(t *testing.T, admin string) {
	t.Helper()
	type summary struct {
		Rule, Kind string
		ErrorBound uint64 `json:"error_bound"`
		Keys       []struct {
			Key        string
			Count, Err uint64
		}
	}
	var last []summary
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get(admin + "/status")
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			TopKeys []summary `json:"top_keys"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		last = st.TopKeys
		counts := map[string]uint64{}
		for _, s := range st.TopKeys {
			if s.Rule != "per-key" || s.Kind != "denied" {
				continue
			}
			for _, k := range s.Keys {
				counts[k.Key] += k.Count
			}
		}
		ok := len(counts) == accessLogAbusers
		for i := 0; i < accessLogAbusers; i++ {
			ok = ok && counts[fmt.Sprintf("abuser-%d", i)] == accessLogAbuse-accessLogLimit
		}
		if ok {
			return
		}
	}
	t.Fatalf("/status top_keys never named the 5 abusers with 20 denials each: %+v", last)
}
