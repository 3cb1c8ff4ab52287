package filter_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// Native tests of token budgets (cost.go): a fake host that serves the response body to
// proxy_get_buffer_bytes, driven callback by callback.

type costHost struct {
	*filtertest.Host
	body     []byte
	trailers [][2]string
}

func (h *costHost) GetBuffer(bt abi.BufferType, start, max int) ([]byte, abi.Status) {
	if bt == abi.BufferResponseBody {
		return h.body, abi.StatusOK
	}
	return h.Host.GetBuffer(bt, start, max)
}

func (h *costHost) GetHeader(mt abi.MapType, name string) ([]byte, abi.Status) {
	if mt == abi.MapResponseTrailers {
		for _, kv := range h.trailers {
			if kv[0] == name {
				return []byte(kv[1]), abi.StatusOK
			}
		}
		return nil, abi.StatusNotFound
	}
	return h.Host.GetHeader(mt, name)
}

type costRig struct {
	t    *testing.T
	h    *costHost
	vm   *filter.VM
	next uint32
}

func startCostRig(t *testing.T, cfg string) *costRig {
	t.Helper()
	h := &costHost{Host: filtertest.NewHost()}
	h.Now_ = t0
	h.Config = []byte(cfg)
	vm := filter.NewVM(h)
	vm.OnContextCreate(1, 0)
	if !vm.OnVMStart(1, 0) || !vm.OnConfigure(1, len(cfg)) {
		t.Fatalf("plugin refused to start: %v", h.Logs)
	}
	return &costRig{t: t, h: h, vm: vm, next: 10}
}

// exchange runs one request reserving maxTokens (as x-max-tokens; "" for none): its
// response (status 200, content type ct) has body in chunks and trailers; the stream
// then ends. It returns the status the client got.
func (r *costRig) exchange(maxTokens, ct string, chunks []string, trailers ...[2]string) (int, map[string]string) {
	h := r.h
	r.next++
	id := r.next
	h.ReqHeaders = [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "x"}, {"x-api-key", "k"}}
	if maxTokens != "" {
		h.ReqHeaders = append(h.ReqHeaders, [2]string{"x-max-tokens", maxTokens})
	}
	h.Properties = map[string]string{}
	h.Local = nil
	r.vm.OnContextCreate(id, 1)
	r.vm.OnRequestHeaders(id, len(h.ReqHeaders), false)
	status := 200
	if h.Local != nil {
		status = h.Local.Status
		hd := map[string]string{}
		for _, kv := range h.Local.Headers {
			hd[kv[0]] = kv[1]
		}
		filtertest.EndStream(r.vm, id)
		return status, hd
	}
	h.RespHeaders = [][2]string{{":status", "200"}}
	if ct != "" {
		h.RespHeaders = append(h.RespHeaders, [2]string{"content-type", ct})
	}
	filtertest.ResponseHeaders(r.vm, id, len(h.RespHeaders), len(chunks) == 0 && len(trailers) == 0)
	for i, c := range chunks {
		h.body = []byte(c)
		filtertest.ResponseBody(r.vm, id, len(c), i == len(chunks)-1 && len(trailers) == 0)
	}
	if len(trailers) > 0 {
		h.trailers = trailers
		r.vm.OnResponseTrailers(id, len(trailers))
	}
	filtertest.EndStream(r.vm, id)
	h.trailers = nil
	return status, nil
}

func (r *costRig) metric(name string) int64 {
	v, _ := r.h.Metrics.Get(name)
	return v
}

func openAIBody(total int) string {
	return `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":` + strconv.Itoa(total/4) + `,"completion_tokens":` + strconv.Itoa(total-total/4) + `,"total_tokens":` + strconv.Itoa(total) + `}}`
}

const budgetCfg = `{"rules":[{"name":"llm","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000,"window":"1h",
 "cost":{"request":{"header":"x-max-tokens","default":500},"response":{"usage":"openai"}}}]}`

// A reservation that does not fit is refused before anything goes upstream; the unused
// part of an admitted one comes back when its response ends.
func TestBudgetRefundsTheUnused(t *testing.T) {
	r := startCostRig(t, budgetCfg)
	if st, _ := r.exchange("600", "application/json", []string{openAIBody(100)}); st != 200 {
		t.Fatalf("first: %d", st)
	}
	// 1000 − 600 + 500 back = 900 left: 800 fits (without the refund only 400 would).
	if st, _ := r.exchange("800", "application/json", []string{openAIBody(800)}); st != 200 {
		t.Fatalf("800 after the refund: %d", st)
	}
	// 100 left: 200 does not fit; Retry-After is the exact wait for 100 more at 1000/h (6 min).
	st, hd := r.exchange("200", "application/json", []string{openAIBody(1)})
	if st != 429 || hd["retry-after"] != "360" {
		t.Fatalf("200 with 100 left: %d %v, want 429 Retry-After 360", st, hd)
	}
	for name, want := range map[string]int64{"sluice.llm.reserved": 1400, "sluice.llm.settled": 2, "sluice.llm.refunded": 500,
		"sluice.llm.excess": 0, "sluice.llm.no_usage": 0, "sluice.llm.allowed": 2, "sluice.llm.denied": 1} {
		if got := r.metric(name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
}

// An excess over the reservation is charged even where it does not fit: the key goes
// into debt and waits until it is paid back.
func TestBudgetChargesTheExcess(t *testing.T) {
	r := startCostRig(t, budgetCfg)
	if st, _ := r.exchange("100", "application/json", []string{openAIBody(1900)}); st != 200 {
		t.Fatalf("first: %d", st)
	}
	// 1000 − 1900 = −900: a request of 1 waits until 901 tokens have refilled (3,243.6 s).
	st, hd := r.exchange("1", "application/json", []string{openAIBody(1)})
	if st != 429 || hd["retry-after"] != "3244" {
		t.Fatalf("in debt: %d %v, want 429 Retry-After 3244", st, hd)
	}
	r.h.Now_ += int64(3243 * time.Second)
	if st, _ := r.exchange("1", "application/json", []string{openAIBody(1)}); st != 429 {
		t.Fatalf("1 s before the debt is paid: %d", st)
	}
	r.h.Now_ += int64(time.Second)
	if st, _ := r.exchange("1", "application/json", []string{openAIBody(1)}); st != 200 {
		t.Fatalf("after the debt is paid: %d", st)
	}
	if got := r.metric("sluice.llm.excess"); got != 1800 {
		t.Errorf("excess %d, want 1800", got)
	}
}

// A server-sent-events stream, cut anywhere: the usage chunk before [DONE] settles it.
func TestBudgetSettlesAStream(t *testing.T) {
	stream := "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"He\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"llo\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":20,\"total_tokens\":30}}\n\n" +
		"data: [DONE]\n\n"
	for _, cut := range []int{1, 7, 50, 101, len(stream) - 3} {
		r := startCostRig(t, budgetCfg)
		r.exchange("900", "text/event-stream; charset=utf-8", []string{stream[:cut], stream[cut:]})
		if got := r.metric("sluice.llm.refunded"); got != 870 {
			t.Fatalf("cut at %d: refunded %d, want 870", cut, got)
		}
	}
}

// A response without its cost settles by no_usage: the reservation stands by default, is
// refunded with "refund". A response header, or a trailer, can carry the cost instead.
func TestBudgetNoUsageAndHeaders(t *testing.T) {
	r := startCostRig(t, budgetCfg)
	for _, body := range []string{`{"usage":{"total_tokens":"30"}}`, `not json`, `{"usage":{"total_tokens":-5}}`, `{"usage":{"total_tokens":99999999999999999999999}}`, ``} {
		r.exchange("10", "application/json", []string{body})
	}
	r.exchange("10", "text/plain", []string{openAIBody(1)}) // not a JSON content type: not read
	if got, want := r.metric("sluice.llm.no_usage"), int64(6); got != want {
		t.Errorf("no_usage %d, want %d", got, want)
	}
	if got := r.metric("sluice.llm.refunded"); got != 0 {
		t.Errorf("refunded %d: the reservations stand", got)
	}
	refund := startCostRig(t, `{"rules":[{"name":"llm","key":[{"header":"x-api-key"}],"algorithm":"leaky_bucket","limit":1000,"window":"1h",
 "cost":{"request":{"header":"x-max-tokens","default":500},"response":{"header":"x-usage"},"no_usage":"refund"}}]}`)
	refund.exchange("700", "", nil)                                           // no x-usage: refunded
	refund.exchange("700", "", []string{"body"}, [2]string{"x-usage", "650"}) // the trailer: 50 back
	if got := refund.metric("sluice.llm.refunded"); got != 750 {
		t.Errorf("refunded %d, want 700 + 50", got)
	}
	if got := refund.metric("sluice.llm.no_usage"); got != 1 {
		t.Errorf("no_usage %d, want 1", got)
	}
}

// The reservation's sources: a header or a query parameter holding a whole number, else
// the default (absent, empty, signed, too large, not a number).
func TestBudgetReservationSources(t *testing.T) {
	r := startCostRig(t, budgetCfg)
	for _, c := range []struct {
		v    string
		want int64
	}{{"", 500}, {"7", 7}, {" 8 ", 8}, {"-3", 500}, {"0", 500}, {"1e3", 500}, {"2000000000", 500}, {"abc", 500}} {
		before := r.metric("sluice.llm.reserved")
		r.exchange(c.v, "application/json", []string{openAIBody(1)})
		if got := r.metric("sluice.llm.reserved") - before; got != c.want {
			t.Errorf("x-max-tokens %q reserved %d, want %d", c.v, got, c.want)
		}
		r.h.Now_ += int64(time.Hour) // refilled for the next
	}
}

// Shadow mode: a shadow budget lets every request through and keeps the account
// enforcement would have kept — reserving and settling what it would have admitted,
// counting in shadow_denied what it would have refused (which reserves nothing, as a
// refusal would not have).
func TestBudgetShadow(t *testing.T) {
	cfg := strings.Replace(budgetCfg, `"window":"1h",`, `"window":"1h","mode":"shadow",`, 1)
	r := startCostRig(t, cfg)
	// 600 reserved, 100 used: 900 left, as enforcing.
	if st, _ := r.exchange("600", "application/json", []string{openAIBody(100)}); st != 200 {
		t.Fatalf("first: %d", st)
	}
	// 950 would not fit in 900: let through, counted as a shadow denial, nothing reserved.
	if st, hd := r.exchange("950", "application/json", []string{openAIBody(950)}); st != 200 || len(hd) != 0 {
		t.Fatalf("a shadow denial: %d %v, want 200 and no rate-limit headers", st, hd)
	}
	// 900 fits exactly what enforcement would have left; it uses 1100: 200 of debt.
	if st, _ := r.exchange("900", "application/json", []string{openAIBody(1100)}); st != 200 {
		t.Fatalf("900 of 900: %d", st)
	}
	// In debt: a request of 1 would be refused; let through.
	if st, _ := r.exchange("1", "application/json", []string{openAIBody(1)}); st != 200 {
		t.Fatalf("in debt, shadow: %d", st)
	}
	for name, want := range map[string]int64{"sluice.llm.reserved": 1500, "sluice.llm.settled": 2, "sluice.llm.refunded": 500,
		"sluice.llm.excess": 200, "sluice.llm.allowed": 2, "sluice.llm.shadow_denied": 2, "sluice.llm.denied": 0} {
		if got := r.metric(name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
}
