package filter_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/internal/topk"
)

func keyed(key string) filtertest.Request {
	r := req("10.1.0.1:1")
	r.Headers = append(r.Headers, [2]string{"x-api-key", key})
	return r
}

// TestAccessLogAttributes: a request far from the limit writes nothing; near the limit,
// denied, shadow-denied and failed-closed each write the rule, the decision, what remains,
// the limit and the key (hashed by default, the same for the same key; raw on request).
func TestAccessLogAttributes(t *testing.T) {
	cfg := `{"rules":[{"name":"per-key","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":10,"window":"1h"}],
	  "access_log": {"near_limit_percent": 20}}`
	n := startNative(t, cfg, t0)
	for i := 0; i < 7; i++ {
		if r := n.do(keyed("alice")); r.Status != 200 || len(r.Attributes) != 0 {
			t.Fatalf("request %d: %d %v, want 200 and nothing written", i+1, r.Status, r.Attributes)
		}
	}
	r := n.do(keyed("alice")) // 2 left of 10: near the limit
	if r.Status != 200 || r.Attributes[filter.AttrDecision] != filter.DecisionNearLimit || r.Attributes[filter.AttrRemaining] != "2" {
		t.Fatalf("8th: %d %v", r.Status, r.Attributes)
	}
	hashed := r.Attributes[filter.AttrKey]
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(hashed) {
		t.Fatalf("hashed key %q", hashed)
	}
	n.do(keyed("alice"))
	n.do(keyed("alice"))
	r = n.do(keyed("alice"))
	want := map[string]string{filter.AttrRule: "per-key", filter.AttrDecision: filter.DecisionDenied,
		filter.AttrRemaining: "0", filter.AttrLimit: "10", filter.AttrKey: hashed}
	if r.Status != 429 || fmt.Sprint(r.Attributes) != fmt.Sprint(want) {
		t.Fatalf("denied: %d %v, want %v", r.Status, r.Attributes, want)
	}
	if r := n.do(keyed("bob")); len(r.Attributes) != 0 {
		t.Fatalf("bob's first: %v", r.Attributes)
	}

	raw := startNative(t, strings.Replace(cfg, `"near_limit_percent": 20`, `"key": "raw", "near_limit_percent": 0`, 1), t0)
	for i := 0; i < 10; i++ {
		raw.do(keyed("a|b\x01"))
	}
	if r := raw.do(keyed("a|b\x01")); r.Attributes[filter.AttrKey] != `a\x7cb\x01` {
		t.Fatalf("raw key %q", r.Attributes[filter.AttrKey])
	}
}

func TestAccessLogShadowDelayedAndFailures(t *testing.T) {
	cfg := `{"rules":[
	  {"name":"shadow","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h","mode":"shadow"},
	  {"name":"roomy","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":100,"window":"1h"}],
	  "access_log": {"key": "none"}}`
	n := startNative(t, cfg, t0)
	if r := n.do(req("10.2.0.1:1")); r.Attributes[filter.AttrDecision] != filter.DecisionNearLimit {
		t.Fatalf("first: %v", r.Attributes)
	}
	r := n.do(req("10.2.0.1:1"))
	if r.Attributes[filter.AttrDecision] != filter.DecisionShadowDenied || r.Attributes[filter.AttrRule] != "shadow" {
		t.Fatalf("second: %v", r.Attributes)
	}
	if _, ok := r.Attributes[filter.AttrKey]; ok {
		t.Fatalf(`"key": "none" wrote a key: %v`, r.Attributes)
	}

	rig := startHoldRig(t, `{"rules":[{"name":"shaped","key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":10,"window":"10s","burst":1,"delay":{"max":"5s"}}],"access_log":{}}`, 1)
	rig.request(0, "u")
	rig.w[0].h.Attributes = nil
	if _, act, _ := rig.request(0, "u"); act != abi.ActionPause {
		t.Fatalf("second request not held: %v", act)
	}
	if got := rig.w[0].h.Attributes; got[filter.AttrDecision] != filter.DecisionDelayed || got[filter.AttrDelayMS] != "1000" {
		t.Fatalf("held: %v", got)
	}
	rig.advance(rig.now + int64(2*time.Second))

	closed := startNative(t, `{"rules":[{"name":"c","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":5,"window":"1h"}],"failure_mode":"closed","access_log":{}}`, t0)
	closed.w.Host.FailShared = 10 // INTERNAL_FAILURE
	if r := closed.do(req("10.2.0.3:1")); r.Status != 503 || r.Attributes[filter.AttrDecision] != filter.DecisionFailedClosed {
		t.Fatalf("closed: %d %v", r.Status, r.Attributes)
	}
	open := startNative(t, `{"rules":[{"name":"o","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":5,"window":"1h"}],"access_log":{}}`, t0)
	open.w.Host.FailShared = 10
	if r := open.do(req("10.2.0.4:1")); r.Status != 200 || r.Attributes[filter.AttrDecision] != filter.DecisionFailedOpen {
		t.Fatalf("open: %d %v", r.Status, r.Attributes)
	}
}

// TestRuleHeaderAndProblemJSON: a refusal names its rule in response.rule_header and
// carries an RFC 9457 body with the rule, limit, window and retry time; an admission has
// neither.
func TestRuleHeaderAndProblemJSON(t *testing.T) {
	cfg := `{"rules":[{"name":"api.v1","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":2,"window":"1m"}],
	  "response":{"rule_header":"X-Sluice-Rule","format":"problem_json"}}`
	n := startNative(t, cfg, t0) // 12:10:00: the window ends in 60 s
	for i := 0; i < 2; i++ {
		if r := n.do(req("10.3.0.1:1")); r.Status != 200 || r.Header("x-sluice-rule") != "" {
			t.Fatalf("admitted: %d %v", r.Status, r.Headers)
		}
	}
	r := n.do(req("10.3.0.1:1"))
	if r.Status != 429 || r.Header("x-sluice-rule") != "api.v1" || r.Header("content-type") != "application/problem+json" {
		t.Fatalf("refused: %d %v", r.Status, r.Headers)
	}
	var pd struct {
		Type, Title, Detail, Rule         string
		Status, Limit, Window, RetryAfter int `json:"-"`
	}
	var nums map[string]any
	if err := json.Unmarshal([]byte(r.Body), &pd); err != nil {
		t.Fatalf("body %q: %v", r.Body, err)
	}
	json.Unmarshal([]byte(r.Body), &nums)
	if pd.Rule != "api.v1" || pd.Title != "Too Many Requests" || nums["status"] != 429.0 || nums["limit"] != 2.0 ||
		nums["window"] != 60.0 || nums["retry_after"] != 60.0 || pd.Detail != "rule api.v1 allows 2 per 60s; retry in 60s" {
		t.Fatalf("body %s", r.Body)
	}

	tm := startNative(t, `{"rules":[{"name":"t","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1m"}],
	  "response":{"format":"template","body":"{\"error\":{\"rule\":\"{rule}\",\"wait\":{retry_after}},\"x\":\"{unknown}\"}","content_type":"application/vnd.err+json"}}`, t0)
	tm.do(req("10.3.0.2:1"))
	r = tm.do(req("10.3.0.2:1"))
	if r.Body != `{"error":{"rule":"t","wait":60},"x":"{unknown}"}` || r.Header("content-type") != "application/vnd.err+json" {
		t.Fatalf("template: %q %v", r.Body, r.Headers)
	}
}

// TestTopKeysFiveAbusers: 10,000 background keys and 5 abusive ones through two workers;
// after a tick each, the shared summary of denials names the 5, and a finished period is
// logged with them at the top.
func TestTopKeysFiveAbusers(t *testing.T) {
	cfg := `{"rules":[{"name":"per-key","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":3,"window":"1h"}],
	  "top_keys":{"size":32,"key":"raw","log_every":"10s","log_top":5}}`
	a := startNative(t, cfg, t0)
	b := startNativeSharing(t, cfg, a)
	for i := 0; i < 10_000; i++ {
		w := a
		if i%2 == 1 {
			w = b
		}
		w.do(keyed(fmt.Sprintf("bg-%d", i)))
		if i%20 == 0 {
			w.do(keyed(fmt.Sprintf("abuser-%d", i/20%5)))
		}
	}
	a.w.Handler.OnTick(1)
	b.w.Handler.OnTick(1)
	val, _, _ := a.w.Host.GetSharedData([]byte(filter.TopKeysPrefix + ":per-key:denied"))
	d, err := topk.Decode(val)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Entries) == 0 || d.Total != 500-15 {
		t.Fatalf("denied summary: total %d, %d counters", d.Total, len(d.Entries))
	}
	top := topOf(d, 5)
	for _, e := range top {
		if !strings.HasPrefix(string(e.Shown()), "abuser-") {
			t.Fatalf("top 5 denied: %v", shownOf(top))
		}
	}
	// The period ends: the next merge logs it.
	a.advance(11 * time.Second)
	a.do(keyed("abuser-0"))
	a.w.Handler.OnTick(1)
	var line string
	for _, l := range a.w.Host.Logs {
		if strings.Contains(l.Msg, "top keys: rule per-key denied") {
			line = l.Msg
		}
	}
	for i := 0; i < 5; i++ {
		if !strings.Contains(line, fmt.Sprintf("abuser-%d=", i)) {
			t.Fatalf("log line %q lacks abuser-%d", line, i)
		}
	}
}

func topOf(d topk.Decoded, n int) []topk.Entry {
	s := topk.New(len(d.Entries) + 1)
	for _, e := range d.Entries {
		x, _ := s.Add(e.ID, e.Count)
		x.SetShown(e.Shown())
	}
	return s.Top(n)
}

func shownOf(es []topk.Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, fmt.Sprintf("%s=%d", e.Shown(), e.Count))
	}
	return out
}

// startNativeSharing starts a second worker sharing a's shared data and metrics.
func startNativeSharing(t *testing.T, cfg string, a *nativeTarget) *nativeTarget {
	t.Helper()
	h := &filtertest.Host{Shared: a.w.Host.Shared, Metrics: a.w.Host.Metrics, Now_: a.w.Host.Now_}
	vm := filter.NewVM(h)
	w := filtertest.NewWorker(h, vm)
	if !w.Start(cfg) {
		t.Fatalf("plugin refused to start: %v", h.Logs)
	}
	return &nativeTarget{w: w, vm: vm}
}
