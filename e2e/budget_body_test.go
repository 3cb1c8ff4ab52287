package e2e

import (
	"bytes"
	"crypto/sha256"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// Reservations read from the JSON request body (cost.request {"json": "max_tokens"}):
// the request's headers wait while its body comes in, and nothing of a refused request
// reaches the upstream. In Envoy this needs allow_on_headers_stop_iteration: true in the
// Wasm PluginConfig; without it the body never reaches the filter while the headers wait,
// and every such request is decided at body_timeout on the default.

// budgetBodyConfig: 1000 tokens an hour per x-api-key, the reservation max_tokens from
// the body (default 100), settled by the OpenAI usage of the response.
func budgetBodyConfig(timeout string) string {
	return `{"rules":[{"name":"llm","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000,"window":"1h",
 "cost":{"request":{"json":"max_tokens","default":100,"body_timeout":"` + timeout + `"},"response":{"usage":"openai"}}}],
 "response":{"headers":"none"}}`
}

// bodyReq is a chat completion whose JSON body carries max_tokens (a number; < 0: none)
// after pad bytes of message content; it returns the request and its body.
func bodyReq(bp *budgetProxy, key, id string, maxTokens int, usage int64, pad int) (*http.Request, []byte) {
	var b strings.Builder
	b.WriteString(`{"model":"e2e-model","messages":[{"role":"user","content":"`)
	b.WriteString(strings.Repeat("p", pad))
	b.WriteString(`"}]`)
	if maxTokens >= 0 {
		b.WriteString(`,"max_tokens":` + strconv.Itoa(maxTokens))
	}
	b.WriteString("}")
	req, _ := http.NewRequest(http.MethodPost, bp.url+chatPath, strings.NewReader(b.String()))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("X-Test-Id", id)
	req.Header.Set("X-Test-Usage", strconv.FormatInt(usage, 10))
	return req, []byte(b.String())
}

// budgetBodySuite: the reservation comes from the body, decided as soon as it is in (not
// at body_timeout, 5 s here); a refused request never reaches the upstream; the upstream
// gets each admitted body byte for byte, a body beyond max_body too.
func budgetBodySuite(t *testing.T, bp *budgetProxy) {
	t.Run("Reserve", func(t *testing.T) {
		const key = "body-reserve"
		before := bp.metrics(t)
		req, sent := bodyReq(bp, key, key, 300, 40, 10)
		began := time.Now()
		r := doOn(bp.clients[0], req)
		mustStatus(t, "a reservation of 300 from the body", r, 200)
		if took := time.Since(began); took > 2*time.Second {
			t.Errorf("took %v: the request waited for body_timeout instead of its body", took)
		}
		if got := bp.up.received(key); !bytes.Equal(got, sent) {
			t.Errorf("the upstream got %q, the client sent %q", got, sent)
		}
		bp.waitMetrics(t, key, before, map[string]int64{"llm.reserved": 300, "llm.settled": 1, "llm.refunded": 260, "llm.allowed": 1})
	})
	t.Run("Refused", func(t *testing.T) {
		const key = "body-refused"
		before := bp.metrics(t)
		start := time.Now()
		req, _ := bodyReq(bp, key, key+"-1", 800, 800, 10)
		r := doOn(bp.clients[1], req)
		mustStatus(t, "800 of 1000", r, 200)
		req, _ = bodyReq(bp, key, key+"-2", 300, 10, 10)
		r = doOn(bp.clients[0], req)
		mustStatus(t, "300 with 200 left", r, 429)
		checkRetryAfter(t, r, 100, start)
		if n := bp.up.requests(key); n != 1 {
			t.Errorf("the upstream saw %d requests of the key, want 1: the refused one reached it", n)
		}
		if got := bp.up.received(key + "-2"); got != nil {
			t.Errorf("the upstream got the refused request's body: %q", got)
		}
		bp.waitMetrics(t, key, before, map[string]int64{"llm.reserved": 800, "llm.settled": 1, "llm.allowed": 1, "llm.denied": 1})
	})
	t.Run("Large", func(t *testing.T) {
		// 200 KiB of content before max_tokens: beyond max_body (64 KiB), so the
		// reservation is the default; the whole body still reaches the upstream.
		const key = "body-large"
		before := bp.metrics(t)
		req, sent := bodyReq(bp, key, key, 700, 50, 200<<10)
		r := doOn(bp.clients[1], req)
		mustStatus(t, "a 200 KiB body", r, 200)
		if got := bp.up.received(key); !bytes.Equal(got, sent) {
			t.Errorf("the upstream got %d bytes (sha256 %x), the client sent %d (sha256 %x)", len(got), sha256.Sum256(got), len(sent), sha256.Sum256(sent))
		}
		bp.waitMetrics(t, key, before, map[string]int64{"llm.reserved": 100, "llm.settled": 1, "llm.refunded": 50, "llm.allowed": 1})
	})
	t.Run("Absent", func(t *testing.T) {
		const key = "body-absent"
		before := bp.metrics(t)
		req, _ := bodyReq(bp, key, key, -1, 100, 10)
		r := doOn(bp.clients[0], req)
		mustStatus(t, "a body without max_tokens", r, 200)
		bp.waitMetrics(t, key, before, map[string]int64{"llm.reserved": 100, "llm.settled": 1, "llm.allowed": 1})
	})
	if n := bp.metrics(t)["llm.body_timeouts"]; n != 0 {
		t.Errorf("llm.body_timeouts = %d, want 0: the bodies came while the headers waited", n)
	}
}

// budgetBodyTimeout: a proxy that holds the body with the headers decides at
// body_timeout (300 ms), on the default, and counts it.
func budgetBodyTimeout(t *testing.T, bp *budgetProxy) {
	const key = "body-timeout"
	before := bp.metrics(t)
	req, sent := bodyReq(bp, key, key, 300, 20, 10)
	began := time.Now()
	r := doOn(bp.clients[0], req)
	took := time.Since(began)
	mustStatus(t, "a request whose body the proxy holds with its headers", r, 200)
	if took < 300*time.Millisecond {
		t.Errorf("answered in %v, before body_timeout (300 ms): decided without its body?", took)
	}
	if got := bp.up.received(key); !bytes.Equal(got, sent) {
		t.Errorf("the upstream got %q, the client sent %q", got, sent)
	}
	now := bp.waitMetrics(t, key, before, map[string]int64{"llm.reserved": 100, "llm.settled": 1, "llm.refunded": 80, "llm.allowed": 1})
	if d := now["llm.body_timeouts"] - before["llm.body_timeouts"]; d != 1 {
		t.Errorf("llm.body_timeouts moved by %d, want 1", d)
	}
	t.Logf("decided at body_timeout: answered in %v", took.Round(time.Millisecond))
}

// TestEnvoyBudgetBody: with allow_on_headers_stop_iteration the body reaches the filter
// while the headers wait; without it, every such request is decided at body_timeout and
// the filter's warning names the setting.
func TestEnvoyBudgetBody(t *testing.T) {
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		if a.dynmod {
			// The dynamic module gets the body while the headers wait, always (a paused
			// request's headers return StopIteration): there is no setting to leave out.
			up := startLLMUpstream(t)
			e := startBudgetBodyEnvoy(t, tg, a, up, budgetBodyConfig("5s"), false)
			bp := newBudgetProxy(envoyProxy(t, e).url, up, envoyMetricsAs(e, a))
			defer bp.close()
			budgetBodySuite(t, bp)
			checkHealthyAs(t, e, a, 2)
			return
		}
		t.Run("StopIteration", func(t *testing.T) {
			up := startLLMUpstream(t)
			e := startBudgetBodyEnvoy(t, tg, a, up, budgetBodyConfig("5s"), true)
			bp := newBudgetProxy(envoyProxy(t, e).url, up, envoyMetrics(e))
			defer bp.close()
			budgetBodySuite(t, bp)
			checkEnvoyHealthy(t, e, 2)
		})
		t.Run("Default", func(t *testing.T) {
			up := startLLMUpstream(t)
			e := startBudgetBodyEnvoy(t, tg, a, up, budgetBodyConfig("300ms"), false)
			bp := newBudgetProxy(envoyProxy(t, e).url, up, envoyMetrics(e))
			defer bp.close()
			budgetBodyTimeout(t, bp)
			if n := strings.Count(e.Log(), "allow_on_headers_stop_iteration: true in the Wasm PluginConfig"); n != 1 {
				t.Errorf("Envoy's log names allow_on_headers_stop_iteration %d times, want once (one warning):\n%s", n, e.Log())
			}
			checkEnvoyHealthyExcept(t, e, 2, bodyWarning)
		})
	})
}

// bodyWarning is the filter's warning when a request's body did not come while its
// headers waited.
var bodyWarning = regexp.MustCompile(`wasm log.*a request waited .* for its body while its headers were held`)

func startBudgetBodyEnvoy(t *testing.T, tg envoyproc.Target, a artifact, up *llmUpstream, config string, allow bool) *envoyproc.Envoy {
	t.Helper()
	render := func(site EnvoySite) ([]byte, error) {
		site.UpstreamPort = up.port
		return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "budget-body", Config: config, ExactBalance: true, CatchAll: true, AllowStopIteration: allow})
	}
	return startEnvoyAs(t, tg, a, 2, render)
}

// TestBudgetBodyRun: the same through `sluice run`: with --allow-on-headers-stop-iteration
// (Envoy's PluginConfig field) the body reaches the filter while the headers wait;
// without it, as in Envoy by default, the request is decided at body_timeout.
func TestBudgetBodyRun(t *testing.T) {
	t.Run("StopIteration", func(t *testing.T) {
		up := startLLMUpstream(t)
		path := filepath.Join(t.TempDir(), "config.json")
		if err := os.WriteFile(path, []byte(budgetBodyConfig("5s")), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := sluiceCmd(t, path, 2)
		cmd.Args = append(cmd.Args, "--upstream", "http://127.0.0.1:"+strconv.Itoa(up.port), "--allow-on-headers-stop-iteration")
		p := startHostCmd(t, cmd)
		bp := newBudgetProxy(p.url, up, runMetrics(p.admin))
		defer bp.close()
		budgetBodySuite(t, bp)
		checkHostHealthy(t, p)
	})
	t.Run("Default", func(t *testing.T) {
		up := startLLMUpstream(t)
		p := startBudgetRun(t, up, budgetBodyConfig("300ms"))
		bp := newBudgetProxy(p.url, up, runMetrics(p.admin))
		defer bp.close()
		budgetBodyTimeout(t, bp)
		checkHostHealthy(t, p)
	})
}
