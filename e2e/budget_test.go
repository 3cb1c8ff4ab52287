package e2e

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// Token budgets (rules[].cost) end to end, through `sluice run` and real Envoy with two
// workers, in front of a fake LLM upstream (budget_upstream_test.go) whose answers report
// a usage the test chose. Every rule: a token bucket of 1000 per hour keyed by x-api-key,
// reserving x-max-tokens (default 500). 1000/h refills 0.28 tokens a second: over the
// seconds a test runs, at most a few tokens, which the assertions allow for.
const budgetConfig = `{"rules":[
 {"name":"llm","match":{"path_prefix":"/v1/"},"key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000,"window":"1h",
  "cost":{"request":{"header":"x-max-tokens","default":500},"response":{"usage":"openai"},"no_usage":"reservation"}},
 {"name":"refund","match":{"path_prefix":"/refund/"},"key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000,"window":"1h",
  "cost":{"request":{"header":"x-max-tokens","default":500},"response":{"usage":"openai"},"no_usage":"refund"}},
 {"name":"claude","match":{"path_prefix":"/anthropic/"},"key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000,"window":"1h",
  "cost":{"request":{"header":"x-max-tokens","default":500},"response":{"usage":"anthropic"}}},
 {"name":"field","match":{"path_prefix":"/field/"},"key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000,"window":"1h",
  "cost":{"request":{"header":"x-max-tokens","default":500},"response":{"json":"usage.completion_tokens"}}},
 {"name":"hdr","match":{"path_prefix":"/hdr/"},"key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000,"window":"1h",
  "cost":{"request":{"header":"x-max-tokens","default":500},"response":{"header":"x-usage"}}}
]}`

const (
	budgetLimit = 1000
	chatPath    = "/v1/chat/completions"
)

// budgetProxy is a proxy under test: its URL, two clients (two connections, which the
// proxies spread over their two workers) used in turn, and its per-rule metrics.
type budgetProxy struct {
	url     string
	up      *llmUpstream
	clients [2]*http.Client
	next    int
	// metrics returns the cost metrics by "rule.metric" (llm.reserved...).
	metrics func(t *testing.T) map[string]int64
	// resets: run budgetResets (TestBudgetRunUpstreamReset runs them for sluice run).
	resets bool
}

func newBudgetProxy(url string, up *llmUpstream, metrics func(t *testing.T) map[string]int64) *budgetProxy {
	bp := &budgetProxy{url: url, up: up, metrics: metrics}
	for i := range bp.clients {
		bp.clients[i] = &http.Client{
			Transport: &http.Transport{Proxy: nil, DisableCompression: true, MaxIdleConnsPerHost: 64},
			Timeout:   30 * time.Second,
		}
	}
	return bp
}

func (bp *budgetProxy) close() {
	for _, c := range bp.clients {
		c.CloseIdleConnections()
	}
}

// llmReq is a request to the fake upstream through the proxy.
type llmReq struct {
	path    string // default chatPath
	key     string // x-api-key
	reserve string // x-max-tokens; "" sends none
	usage   int64  // x-test-usage; 0 sends none (the upstream's default, 100)
	mode    string // x-test-mode
	id      string // x-test-id
	gate    string // x-test-gate
	stream  bool   // "stream":true in the request body
}

type llmResp struct {
	status int
	header http.Header
	body   []byte
	err    error // sending, or reading the body
}

func (bp *budgetProxy) request(r llmReq) *http.Request {
	path := r.path
	if path == "" {
		path = chatPath
	}
	body := `{"model":"e2e-model","messages":[{"role":"user","content":"Count to five."}],"max_tokens":` + strconv.Quote(r.reserve)
	if r.stream {
		body += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	body += "}"
	req, _ := http.NewRequest(http.MethodPost, bp.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", r.key)
	for k, v := range map[string]string{"X-Max-Tokens": r.reserve, "X-Test-Mode": r.mode, "X-Test-Id": r.id, "X-Test-Gate": r.gate} {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	if r.usage != 0 {
		req.Header.Set("X-Test-Usage", strconv.FormatInt(r.usage, 10))
	}
	if r.mode == "gzip" {
		// Asked for, so that no hop decompresses it on the client's behalf (Go's
		// Transport, behind sluice run, would: it adds Accept-Encoding itself).
		req.Header.Set("Accept-Encoding", "gzip")
	}
	return req
}

// do sends r on the next of the two clients and reads the whole answer.
func (bp *budgetProxy) do(r llmReq) llmResp {
	c := bp.clients[bp.next%len(bp.clients)]
	bp.next++
	return doOn(c, bp.request(r))
}

func doOn(c *http.Client, req *http.Request) llmResp {
	resp, err := c.Do(req)
	if err != nil {
		return llmResp{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return llmResp{status: resp.StatusCode, header: resp.Header, body: body, err: err}
}

func (r llmResp) String() string {
	if r.status == 0 {
		return fmt.Sprintf("error %v", r.err)
	}
	b := r.body
	if len(b) > 300 {
		b = append(b[:300:300], "…"...)
	}
	s := fmt.Sprintf("%d retry-after=%q %q", r.status, r.header.Get("Retry-After"), b)
	if r.err != nil {
		s += fmt.Sprintf(" (read error: %v)", r.err)
	}
	return s
}

// mustStatus fails the test unless r got status (and, for 200, the whole body).
func mustStatus(t *testing.T, what string, r llmResp, status int) {
	t.Helper()
	if r.status != status || (status == 200 && r.err != nil) {
		t.Fatalf("%s: %s, want %d", what, r, status)
	}
}

// deltas is the change of every metric since before.
func deltas(before, now map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for k, v := range now {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// waitMetrics polls until every metric of want moved by exactly its value since before,
// and the rule's other cost metrics did not move unless want names them (deadline 10 s).
// It returns the metrics then.
func (bp *budgetProxy) waitMetrics(t *testing.T, what string, before map[string]int64, want map[string]int64) map[string]int64 {
	t.Helper()
	rules := map[string]bool{}
	for k := range want {
		rule, _, _ := strings.Cut(k, ".")
		rules[rule] = true
	}
	check := func(now map[string]int64) []string {
		var bad []string
		d := deltas(before, now)
		for k, v := range d {
			rule, m, _ := strings.Cut(k, ".")
			if _, named := want[k]; !named && rules[rule] && isCostMetric(m) && v != 0 {
				bad = append(bad, fmt.Sprintf("%s moved by %d, want 0", k, v))
			}
		}
		for k, v := range want {
			if d[k] != v {
				bad = append(bad, fmt.Sprintf("%s moved by %d, want %d", k, d[k], v))
			}
		}
		sort.Strings(bad)
		return bad
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		now := bp.metrics(t)
		bad := check(now)
		if len(bad) == 0 {
			return now
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: metrics after 10 s: %s (all moves: %v)", what, strings.Join(bad, "; "), deltas(before, now))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isCostMetric(m string) bool {
	switch m {
	case "reserved", "settled", "refunded", "excess", "no_usage", "allowed", "denied", "store_errors":
		return true
	}
	return false
}

// checkRetryAfter checks a refusal's Retry-After: the exact wait for need tokens at 1000
// an hour (⌈need × 3.6 s⌉), less what refilled since the key's first request (since):
// each second refills a second's worth of the wait.
func checkRetryAfter(t *testing.T, r llmResp, need int64, since time.Time) {
	t.Helper()
	slack := time.Since(since).Seconds() + 1
	got, err := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
	exact := (need*36 + 9) / 10 // ⌈need × 3.6⌉
	if err != nil || got > exact || float64(got) < float64(exact)-slack-1 {
		t.Errorf("Retry-After %q, want %d (the wait for %d tokens) less at most %.0f s of refill", r.header.Get("Retry-After"), exact, need, slack)
	}
}

// budgetSuite runs every scenario against one proxy, in order (each on keys of its own;
// the metrics are checked as moves since the scenario began).
func budgetSuite(t *testing.T, bp *budgetProxy) {
	t.Run("Exact", func(t *testing.T) { budgetExact(t, bp) })
	t.Run("ExactConcurrent", func(t *testing.T) { budgetExactConcurrent(t, bp) })
	t.Run("Excess", func(t *testing.T) { budgetExcess(t, bp) })
	t.Run("Debt", func(t *testing.T) { budgetDebt(t, bp) })
	t.Run("SSE", func(t *testing.T) { budgetSSE(t, bp) })
	t.Run("SSEUnbuffered", func(t *testing.T) { budgetSSEUnbuffered(t, bp) })
	t.Run("Hostile", func(t *testing.T) { budgetHostile(t, bp) })
	if bp.resets {
		t.Run("UpstreamReset", func(t *testing.T) { budgetResets(t, bp) })
	}
	t.Run("NoUsageStands", func(t *testing.T) { budgetNoUsageStands(t, bp) })
	t.Run("NoUsageRefund", func(t *testing.T) { budgetNoUsageRefund(t, bp) })
	t.Run("Anthropic", func(t *testing.T) { budgetAnthropic(t, bp) })
	t.Run("Sources", func(t *testing.T) { budgetSources(t, bp) })
}

// budgetExact: requests reserving 400 whose responses report 100, one after the other
// (each sent once the one before settled), alternating between the two connections: each
// leaves 100 spent, so 7 are admitted (1000, 900, … 400 left when each arrives), not 2,
// and the 8th waits for the 100 tokens it lacks.
func budgetExact(t *testing.T, bp *budgetProxy) {
	const key = "exact"
	start := time.Now()
	before := bp.metrics(t)
	admitted := 0
	var last llmResp
	for i := 0; i < 20; i++ {
		last = bp.do(llmReq{key: key, reserve: "400", usage: 100, id: key + strconv.Itoa(i)})
		if last.status != 200 {
			break
		}
		if last.err != nil {
			t.Fatalf("request %d: %s", i, last)
		}
		admitted++
		bp.waitMetrics(t, fmt.Sprintf("after request %d", i), before, map[string]int64{
			"llm.reserved": 400 * int64(admitted), "llm.settled": int64(admitted), "llm.refunded": 300 * int64(admitted),
			"llm.allowed": int64(admitted),
		})
	}
	mustStatus(t, fmt.Sprintf("request %d", admitted), last, 429)
	if admitted != 7 {
		t.Fatalf("%d admitted, want 7 (each settles to 100 of its 400)", admitted)
	}
	if n := bp.up.requests(key); n != admitted {
		t.Errorf("the upstream saw %d requests, %d were admitted", n, admitted)
	}
	// The actual usage admitted: 7 × 100, within the limit (no excess in flight).
	if used := 100 * admitted; used > budgetLimit {
		t.Errorf("%d tokens used, over the limit %d", used, budgetLimit)
	}
	checkRetryAfter(t, last, 100, start)
	bp.waitMetrics(t, "at the end", before, map[string]int64{
		"llm.reserved": 400 * 7, "llm.settled": 7, "llm.refunded": 300 * 7, "llm.excess": 0, "llm.no_usage": 0,
		"llm.allowed": 7, "llm.denied": 1,
	})
	t.Logf("%d admitted, then %s", admitted, last)
}

// budgetExactConcurrent: rounds of 6 concurrent requests reserving 400 (usage 100), held
// at the upstream until every decision of the round is made, so no settlement helps a
// request of its own round: 1000 left admits 2, 800 → 2, 600 → 1, 500 → 1, 400 → 1,
// 300 → 0. Every refusal comes before anything reaches the upstream.
func budgetExactConcurrent(t *testing.T, bp *budgetProxy) {
	const key = "concurrent"
	const n = 6
	before := bp.metrics(t)
	want := []int{2, 2, 1, 1, 1, 0}
	total := 0
	tr := &http.Transport{Proxy: nil, DisableCompression: true, MaxIdleConnsPerHost: n}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	for round, w := range want {
		gate := fmt.Sprintf("%s-%d", key, round)
		results := make(chan llmResp, n)
		for i := 0; i < n; i++ {
			go func() { results <- doOn(c, bp.request(llmReq{key: key, reserve: "400", usage: 100, gate: gate})) }()
		}
		// The refusals come back at once; the admitted wait at the gate.
		var got []llmResp
		deadline := time.Now().Add(10 * time.Second)
		for len(got)+bp.up.waiting(key) < n {
			select {
			case r := <-results:
				got = append(got, r)
			case <-time.After(10 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d answered and %d waiting at the upstream after 10 s", round, len(got), bp.up.waiting(key))
			}
		}
		for _, r := range got {
			mustStatus(t, fmt.Sprintf("round %d: a request answered before the round's admitted ones", round), r, 429)
		}
		if held := bp.up.waiting(key); held != w {
			t.Fatalf("round %d: %d admitted (at the upstream), want %d", round, held, w)
		}
		bp.up.release(gate)
		for i := len(got); i < n; i++ {
			mustStatus(t, fmt.Sprintf("round %d: an admitted request", round), <-results, 200)
		}
		total += w
		bp.waitMetrics(t, fmt.Sprintf("round %d", round), before, map[string]int64{
			"llm.reserved": 400 * int64(total), "llm.settled": int64(total), "llm.refunded": 300 * int64(total),
			"llm.allowed": int64(total), "llm.denied": int64((round+1)*n - total),
		})
	}
	if got := bp.up.requests(key); got != total {
		t.Errorf("the upstream saw %d requests, %d were admitted", got, total)
	}
	t.Logf("rounds of %d admitted %v (%d in all, %d tokens used of %d)", n, want, total, 100*total, budgetLimit)
}

// budgetExcess: a request reserving 100 whose response reports 900 is charged the 800
// beyond its reservation: 100 are left, so a request reserving 200 is refused (and never
// reaches the upstream) while one reserving 100 is admitted.
func budgetExcess(t *testing.T, bp *budgetProxy) {
	const key = "excess"
	start := time.Now()
	before := bp.metrics(t)
	mustStatus(t, "the first request", bp.do(llmReq{key: key, reserve: "100", usage: 900}), 200)
	bp.waitMetrics(t, "after the first", before, map[string]int64{
		"llm.reserved": 100, "llm.settled": 1, "llm.excess": 800, "llm.allowed": 1,
	})
	r := bp.do(llmReq{key: key, reserve: "200", usage: 100})
	mustStatus(t, "a request reserving 200 with 100 left", r, 429)
	checkRetryAfter(t, r, 100, start)
	if n := bp.up.requests(key); n != 1 {
		t.Fatalf("the upstream saw %d requests, want 1 (the refused one must not reach it)", n)
	}
	mustStatus(t, "a request reserving 100 with 100 left", bp.do(llmReq{key: key, reserve: "100", usage: 100}), 200)
	bp.waitMetrics(t, "at the end", before, map[string]int64{
		"llm.reserved": 200, "llm.settled": 2, "llm.excess": 800, "llm.allowed": 2, "llm.denied": 1,
	})
}

// budgetDebt: an excess is charged even below zero: reserving 100 and using 3000 leaves
// the key 2000 in debt, so even a request reserving 1 waits for 2001 tokens (7204 s).
func budgetDebt(t *testing.T, bp *budgetProxy) {
	const key = "debt"
	start := time.Now()
	before := bp.metrics(t)
	mustStatus(t, "the first request", bp.do(llmReq{key: key, reserve: "100", usage: 3000}), 200)
	bp.waitMetrics(t, "after the first", before, map[string]int64{
		"llm.reserved": 100, "llm.settled": 1, "llm.excess": 2900, "llm.allowed": 1,
	})
	r := bp.do(llmReq{key: key, reserve: "1"})
	mustStatus(t, "a request reserving 1 in debt", r, 429)
	checkRetryAfter(t, r, 2001, start)
	if n := bp.up.requests(key); n != 1 {
		t.Fatalf("the upstream saw %d requests, want 1", n)
	}
}

// budgetSSE: a streamed completion settles by the usage in its last chunk, and the client
// gets the stream byte for byte as the upstream sent it.
func budgetSSE(t *testing.T, bp *budgetProxy) {
	const key = "sse"
	start := time.Now()
	before := bp.metrics(t)
	for i, c := range []struct {
		reserve         string
		usage           int64
		refund, excess  int64
		settled, reserv int64
	}{
		{"400", 150, 250, 0, 1, 400},
		{"400", 700, 250, 300, 2, 800},
	} {
		id := fmt.Sprintf("%s-%d", key, i)
		r := bp.do(llmReq{key: key, reserve: c.reserve, usage: c.usage, stream: true, id: id})
		mustStatus(t, id, r, 200)
		if ct := r.header.Get("Content-Type"); ct != "text/event-stream" {
			t.Errorf("%s: Content-Type %q", id, ct)
		}
		if sent := bp.up.body(id); !bytes.Equal(r.body, sent) || !bytes.HasSuffix(sent, []byte("data: [DONE]\n\n")) {
			t.Errorf("%s: the client got %d bytes, the upstream sent %d:\n got: %q\nsent: %q", id, len(r.body), len(sent), r.body, sent)
		}
		bp.waitMetrics(t, id, before, map[string]int64{
			"llm.reserved": c.reserv, "llm.settled": c.settled, "llm.refunded": c.refund, "llm.excess": c.excess, "llm.allowed": c.settled,
		})
	}
	// 1000 − 150 − 700 = 150 left.
	r := bp.do(llmReq{key: key, reserve: "200", stream: true})
	mustStatus(t, "a request reserving 200 with 150 left", r, 429)
	checkRetryAfter(t, r, 50, start)
}

// budgetSSEUnbuffered: the filter reads the stream as it passes: the client gets the first
// events while the upstream still holds the rest back.
func budgetSSEUnbuffered(t *testing.T, bp *budgetProxy) {
	const key = "unbuffered"
	before := bp.metrics(t)
	gate := key
	req := bp.request(llmReq{key: key, reserve: "300", usage: 40, stream: true, gate: gate, id: key})
	resp, err := bp.clients[0].Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := openaiChunk(0, "token") + openaiChunk(1, "token")
	got := make([]byte, len(first))
	read := make(chan error, 1)
	go func() { _, err := io.ReadFull(resp.Body, got); read <- err }()
	select {
	case err := <-read:
		if err != nil || string(got) != first {
			t.Fatalf("the first events: %q (%v), want %q", got, err, first)
		}
	case <-time.After(10 * time.Second):
		bp.up.release(gate)
		t.Fatalf("the first two events did not reach the client within 10 s while the upstream held the rest: the stream is buffered")
	}
	bp.up.release(gate)
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if all := append(got, rest...); !bytes.Equal(all, bp.up.body(key)) {
		t.Errorf("the client got %q, the upstream sent %q", all, bp.up.body(key))
	}
	bp.waitMetrics(t, key, before, map[string]int64{
		"llm.reserved": 300, "llm.settled": 1, "llm.refunded": 260, "llm.allowed": 1,
	})
}

// hostileCase is one broken or hostile answer: what the client must get and how the
// request settles.
type hostileCase struct {
	mode    string
	reserve int64
	usage   int64
	status  int  // 0: the answer is cut (a read error, or a short body)
	stream  bool // the upstream answers a stream
	// found: the usage counts (settled by it); otherwise by no_usage "reservation"
	found bool
	// same: the client gets exactly what the upstream sent
	same bool
}

// budgetHostile: answers that say nothing usable about their cost, or are cut, or are
// huge — each answered, and settled by its usage where the body reported one before it
// ended, by no_usage (the reservation stands) otherwise; never a VM failure (checked when
// the suite ends).
func budgetHostile(t *testing.T, bp *budgetProxy) {
	budgetHostileCases(t, bp, []hostileCase{
		{mode: "nonjson", reserve: 300, status: 200, same: true},
		{mode: "string", reserve: 300, status: 200, same: true},
		{mode: "negative", reserve: 300, status: 200, same: true},
		{mode: "overflow", reserve: 300, status: 200, same: true},
		{mode: "gzip", reserve: 300, status: 200, same: true},
		{mode: "error", reserve: 300, status: 500, same: true},
		{mode: "sse-nousage", reserve: 300, status: 200, stream: true, same: true},
		{mode: "huge", reserve: 400, usage: 250, status: 200, same: true, found: true},
		{mode: "bigline", reserve: 400, usage: 80, status: 200, stream: true, same: true, found: true},
	})
}

// budgetResets: an upstream that cuts the connection in the middle of a stream, before
// its usage chunk (settled by no_usage: the reservation stands under rule llm, is
// refunded under rule refund) or after it (settled by the usage it reported).
func budgetResets(t *testing.T, bp *budgetProxy) {
	budgetHostileCases(t, bp, []hostileCase{
		{mode: "reset-early", reserve: 300, status: 0, stream: true},
		{mode: "reset-late", reserve: 300, usage: 120, status: 0, stream: true, found: true},
	})
	t.Run("refund", func(t *testing.T) {
		const key = "reset-refund"
		before := bp.metrics(t)
		for i := int64(1); i <= 4; i++ {
			// 4 × 400: admitted only if each cut stream's reservation came back.
			r := bp.do(llmReq{path: "/refund" + chatPath, key: key, reserve: "400", mode: "reset-early"})
			if r.status != 200 {
				t.Fatalf("cut stream %d: %s, want 200 (every earlier reservation refunded)", i, r)
			}
			bp.waitMetrics(t, "a cut stream", before, map[string]int64{
				"refund.reserved": 400 * i, "refund.settled": i, "refund.refunded": 400 * i, "refund.no_usage": i, "refund.allowed": i,
			})
		}
	})
}

func budgetHostileCases(t *testing.T, bp *budgetProxy, cases []hostileCase) {
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			key := "hostile-" + c.mode
			before := bp.metrics(t)
			began := time.Now()
			r := bp.do(llmReq{key: key, reserve: strconv.FormatInt(c.reserve, 10), usage: c.usage, mode: c.mode, id: key})
			took := time.Since(began)
			sent := bp.up.body(key)
			switch {
			case c.status == 0:
				// The upstream cut the stream after the headers: the client sees a
				// truncated body (a read error, or a stream without its end).
				if r.err == nil && r.status == 200 && bytes.HasSuffix(r.body, []byte("[DONE]\n\n")) {
					t.Errorf("a cut stream arrived whole: %s", r)
				}
				if r.status != 0 && r.status != 200 && r.status != 502 && r.status != 503 {
					t.Errorf("a cut stream: %s, want 200 and a short body (or 502/503)", r)
				}
				if r.status == 200 && !bytes.HasPrefix(sent, r.body) {
					t.Errorf("the client got %q, not a prefix of what the upstream sent %q", r.body, sent)
				}
			default:
				mustStatus(t, c.mode, r, c.status)
			}
			if c.same && !bytes.Equal(r.body, sent) {
				t.Errorf("the client got %d bytes (sha256 %x), the upstream sent %d (sha256 %x)", len(r.body), sha256.Sum256(r.body), len(sent), sha256.Sum256(sent))
			}
			want := map[string]int64{"llm.reserved": c.reserve, "llm.settled": 1, "llm.allowed": 1}
			if c.found {
				if d := c.usage - c.reserve; d < 0 {
					want["llm.refunded"] = -d
				} else {
					want["llm.excess"] = d
				}
			} else {
				want["llm.no_usage"] = 1
			}
			bp.waitMetrics(t, c.mode, before, want)
			if n := bp.up.requests(key); n != 1 {
				t.Errorf("the upstream saw %d requests, want 1", n)
			}
			t.Logf("%s: %d bytes to the client in %v, %s", c.mode, len(r.body), took.Round(time.Millisecond), func() string {
				if c.found {
					return "settled by its usage"
				}
				return "settled by no_usage"
			}())
		})
	}
}

// budgetNoUsageStands: with no_usage "reservation", a stream without usage costs what it
// reserved: two of 400 leave 200, and a third is refused.
func budgetNoUsageStands(t *testing.T, bp *budgetProxy) {
	const key = "nousage"
	start := time.Now()
	before := bp.metrics(t)
	for i := 1; i <= 2; i++ {
		mustStatus(t, "a stream without usage", bp.do(llmReq{key: key, reserve: "400", mode: "sse-nousage"}), 200)
		bp.waitMetrics(t, "after it", before, map[string]int64{
			"llm.reserved": 400 * int64(i), "llm.settled": int64(i), "llm.no_usage": int64(i), "llm.allowed": int64(i),
		})
	}
	r := bp.do(llmReq{key: key, reserve: "400", mode: "sse-nousage"})
	mustStatus(t, "a third reserving 400 with 200 left", r, 429)
	checkRetryAfter(t, r, 200, start)
}

// budgetNoUsageRefund: with no_usage "refund" (rule refund), a stream without usage, a
// non-JSON body and an error without usage cost nothing: 3 × 3 of 400 are all admitted.
func budgetNoUsageRefund(t *testing.T, bp *budgetProxy) {
	const key = "refund"
	start := time.Now()
	before := bp.metrics(t)
	n := int64(0)
	for round := 0; round < 3; round++ {
		for _, mode := range []string{"sse-nousage", "nonjson", "error"} {
			r := bp.do(llmReq{path: "/refund" + chatPath, key: key, reserve: "400", mode: mode})
			if want := map[bool]int{true: 500, false: 200}[mode == "error"]; r.status != want {
				t.Fatalf("%s (request %d): %s, want %d (every earlier reservation refunded)", mode, n+1, r, want)
			}
			n++
			bp.waitMetrics(t, mode, before, map[string]int64{
				"refund.reserved": 400 * n, "refund.settled": n, "refund.refunded": 400 * n, "refund.no_usage": n, "refund.allowed": n,
			})
		}
	}
	// A usage still counts under "refund": 1000 − 900 leaves 100.
	mustStatus(t, "a request reporting 900", bp.do(llmReq{path: "/refund" + chatPath, key: key, reserve: "400", usage: 900}), 200)
	bp.waitMetrics(t, "after it", before, map[string]int64{
		"refund.reserved": 400 * (n + 1), "refund.settled": n + 1, "refund.refunded": 400 * n, "refund.excess": 500,
		"refund.no_usage": n, "refund.allowed": n + 1,
	})
	r := bp.do(llmReq{path: "/refund" + chatPath, key: key, reserve: "400"})
	mustStatus(t, "reserving 400 with 100 left", r, 429)
	checkRetryAfter(t, r, 300, start)
}

// budgetAnthropic: an Anthropic stream (message_start with input and cache tokens,
// content_block_delta…, message_delta with the output count, message_stop) settles
// input + output + cache tokens; a JSON Message likewise.
func budgetAnthropic(t *testing.T, bp *budgetProxy) {
	const key = "anthropic"
	start := time.Now()
	before := bp.metrics(t)
	// usage 200: input 50, output 150, cache read 10, creation 5: 215.
	id := key + "-sse"
	r := bp.do(llmReq{path: "/anthropic/v1/messages", key: key, reserve: "400", usage: 200, stream: true, id: id})
	mustStatus(t, id, r, 200)
	if sent := bp.up.body(id); !bytes.Equal(r.body, sent) || !bytes.Contains(sent, []byte("event: message_stop")) {
		t.Errorf("the client got %q, the upstream sent %q", r.body, sent)
	}
	bp.waitMetrics(t, id, before, map[string]int64{
		"claude.reserved": 400, "claude.settled": 1, "claude.refunded": 400 - 215, "claude.allowed": 1,
	})
	// usage 600: 150 + 450 + 15 = 615, 115 beyond the reservation.
	id = key + "-json"
	r = bp.do(llmReq{path: "/anthropic/v1/messages", key: key, reserve: "500", usage: 600, id: id})
	mustStatus(t, id, r, 200)
	if !bytes.Equal(r.body, bp.up.body(id)) {
		t.Errorf("the client got %q, the upstream sent %q", r.body, bp.up.body(id))
	}
	bp.waitMetrics(t, id, before, map[string]int64{
		"claude.reserved": 900, "claude.settled": 2, "claude.refunded": 185, "claude.excess": 115, "claude.allowed": 2,
	})
	// 1000 − 215 − 615 = 170 left.
	r = bp.do(llmReq{path: "/anthropic/v1/messages", key: key, reserve: "200", stream: true})
	mustStatus(t, "reserving 200 with 170 left", r, 429)
	checkRetryAfter(t, r, 30, start)
}

// budgetSources: the reservation's default (no x-max-tokens, or one that is not a whole
// number), a JSON field of the response (rule field: usage.completion_tokens) and a
// response header (rule hdr: x-usage) as the actual cost.
func budgetSources(t *testing.T, bp *budgetProxy) {
	before := bp.metrics(t)
	for i, reserve := range []string{"", "lots", "-5"} {
		// 500 each, settled to 100: admitted one after the other (500 left at most).
		n := int64(i + 1)
		mustStatus(t, "x-max-tokens: "+strconv.Quote(reserve), bp.do(llmReq{key: "default", reserve: reserve, usage: 100}), 200)
		bp.waitMetrics(t, "default reservations", before, map[string]int64{
			"llm.reserved": 500 * n, "llm.settled": n, "llm.refunded": 400 * n, "llm.allowed": n,
		})
	}
	// usage 200: completion_tokens 150.
	mustStatus(t, "json field", bp.do(llmReq{path: "/field" + chatPath, key: "field", reserve: "400", usage: 200}), 200)
	// x-usage: 700, the response header (rule hdr reads no body).
	mustStatus(t, "header", bp.do(llmReq{path: "/hdr" + chatPath, key: "hdr", reserve: "400", usage: 700}), 200)
	bp.waitMetrics(t, "field and header", before, map[string]int64{
		"llm.reserved": 1500, "llm.settled": 3, "llm.refunded": 1200, "llm.allowed": 3,
		"field.reserved": 400, "field.settled": 1, "field.refunded": 250, "field.allowed": 1,
		"hdr.reserved": 400, "hdr.settled": 1, "hdr.excess": 300, "hdr.allowed": 1,
	})
	// hdr: 300 left; a response without x-usage (a stream) settles by no_usage.
	mustStatus(t, "no header", bp.do(llmReq{path: "/hdr" + chatPath, key: "hdr", reserve: "300", stream: true}), 200)
	bp.waitMetrics(t, "no header", before, map[string]int64{
		"hdr.reserved": 700, "hdr.settled": 2, "hdr.excess": 300, "hdr.no_usage": 1, "hdr.allowed": 2,
	})
	r := bp.do(llmReq{path: "/hdr" + chatPath, key: "hdr", reserve: "1"})
	mustStatus(t, "hdr: reserving 1 with nothing left", r, 429)
}

// runMetrics reads sluice run's /metrics as "rule.metric" (sluice_llm_no_usage →
// llm.no_usage; the rule names here have no underscore).
func runMetrics(admin string) func(t *testing.T) map[string]int64 {
	return func(t *testing.T) map[string]int64 {
		t.Helper()
		m := map[string]int64{}
		for _, l := range strings.Split(adminGet(t, admin+"/metrics"), "\n") {
			name, val, ok := strings.Cut(l, " ")
			if !ok || strings.HasPrefix(l, "#") {
				continue
			}
			rest, ok := strings.CutPrefix(name, "sluice_")
			if !ok {
				continue
			}
			rule, metric, ok := strings.Cut(rest, "_")
			if !ok {
				continue
			}
			if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
				m[rule+"."+metric] = int64(f)
			}
		}
		return m
	}
}

// envoyMetrics reads Envoy's wasmcustom.sluice.<rule>.<metric> stats as "rule.metric".
func envoyMetrics(e *envoyproc.Envoy) func(t *testing.T) map[string]int64 {
	return envoyMetricsAs(e, artWasm)
}

// envoyMetricsAs is envoyMetrics for artifact a.
func envoyMetricsAs(e *envoyproc.Envoy, a artifact) func(t *testing.T) map[string]int64 {
	prefix := a.stats + "sluice."
	return func(t *testing.T) map[string]int64 {
		t.Helper()
		st, err := e.Stats(strings.ReplaceAll(prefix, ".", `\.`))
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int64{}
		for k, v := range st {
			if rest, ok := strings.CutPrefix(k, prefix); ok {
				m[rest] = v
			}
		}
		return m
	}
}

// startBudgetRun starts `sluice run` with two workers and config in front of up.
func startBudgetRun(t *testing.T, up *llmUpstream, config string) *proxy {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := sluiceCmd(t, path, 2)
	cmd.Args = append(cmd.Args, "--upstream", "http://127.0.0.1:"+strconv.Itoa(up.port))
	return startHostCmd(t, cmd)
}

// startBudgetEnvoy starts Envoy with two workers (exact connection balance) and config in
// front of up.
func startBudgetEnvoy(t *testing.T, tg envoyproc.Target, a artifact, up *llmUpstream, name, config string) *envoyproc.Envoy {
	t.Helper()
	render := func(site EnvoySite) ([]byte, error) {
		site.UpstreamPort = up.port
		return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: name, Config: config, ExactBalance: true, CatchAll: true})
	}
	return startEnvoyAs(t, tg, a, 2, render)
}

// TestBudgetRun: the token-budget scenarios through `sluice run` with two workers, all but
// budgetResets, which TestBudgetRunUpstreamReset runs on a sluice run of its own.
func TestBudgetRun(t *testing.T) {
	up := startLLMUpstream(t)
	p := startBudgetRun(t, up, budgetConfig)
	bp := newBudgetProxy(p.url, up, runMetrics(p.admin))
	defer bp.close()
	budgetSuite(t, bp)
	checkHostHealthy(t, p)
	checkNoStoreErrors(t, bp)
}

// checkNoStoreErrors fails the test if a rule counted a store error (a settlement that
// could not be written).
func checkNoStoreErrors(t *testing.T, bp *budgetProxy) {
	t.Helper()
	for k, v := range bp.metrics(t) {
		if strings.HasSuffix(k, ".store_errors") && v != 0 {
			t.Errorf("%s = %d", k, v)
		}
	}
}

// TestBudgetEnvoy: the same through each real Envoy with two workers.
func TestBudgetEnvoy(t *testing.T) {
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		up := startLLMUpstream(t)
		e := startBudgetEnvoy(t, tg, a, up, "budget", budgetConfig)
		bp := newBudgetProxy(envoyProxy(t, e).url, up, envoyMetricsAs(e, a))
		bp.resets = true
		defer bp.close()
		budgetSuite(t, bp)
		checkHealthyAs(t, e, a, 2)
		checkNoStoreErrors(t, bp)
	})
}
