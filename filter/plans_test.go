package filter_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

const plansCfg = `{"rules":[{"name":"api","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":3,"window":"1h",
  "plans":{"by":{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.plan"}},"values":{"free":2,"pro":{"limit":5,"window":"1m"}},"default":"free"},
  "overrides":{"by":{"header":"x-api-key"},"values":{"acme":7}}}],"response":{"headers":"both"}}`

func planReq(key, plan string) filtertest.Request {
	r := filtertest.Request{Source: "10.0.0.1:1", Headers: [][2]string{{"x-api-key", key}}, Properties: map[string]string{}}
	if plan != "" {
		r.Properties[propPlan] = plan
	}
	return r
}

// admitted counts the requests admitted of n.
func admitted(n target, req filtertest.Request, count int) (int, filtertest.Response) {
	ok := 0
	var last filtertest.Response
	for i := 0; i < count; i++ {
		last = n.do(req)
		if last.Status == 200 {
			ok++
		}
	}
	return ok, last
}

// override > plan > default plan; each key its own count; headers report the limit that
// applied.
func TestPlansAndOverrides(t *testing.T) {
	forEachTarget(t, plansCfg, func(t *testing.T, n target) {
		for _, c := range []struct {
			key, plan string
			want      int
			policy    string
		}{
			{"k-none", "", 2, `"api";q=2;w=3600`}, // no plan: the default plan (first: the emulator cannot unset a property)
			{"k-free", "free", 2, `"api";q=2;w=3600`},
			{"k-pro", "pro", 5, `"api";q=5;w=60`},
			{"k-odd", "platinum", 2, `"api";q=2;w=3600`}, // unknown plan: the default plan
			{"acme", "free", 7, `"api";q=7;w=3600`},      // the override wins over the plan
		} {
			got, last := admitted(n, planReq(c.key, c.plan), 10)
			if got != c.want {
				t.Errorf("%s (%s): %d admitted, want %d", c.key, c.plan, got, c.want)
			}
			if p := last.Header("ratelimit-policy"); p != c.policy {
				t.Errorf("%s: policy %q, want %q", c.key, p, c.policy)
			}
			if l := last.Header("x-ratelimit-limit"); l != strconv.Itoa(c.want) {
				t.Errorf("%s: x-ratelimit-limit %q", c.key, l)
			}
		}
		// A plan change applies on the next request, to that key only: k-free moves to pro
		// (its 2 admissions count against pro's 5 in a fresh window: pro's window is 1m).
		got, _ := admitted(n, planReq("k-free", "pro"), 10)
		if got < 3 {
			t.Errorf("k-free upgraded to pro: %d more admitted, want at least 3", got)
		}
		if got, _ := admitted(n, planReq("k-pro", "pro"), 1); got != 0 {
			t.Error("k-pro reset by another key's plan change")
		}
	})
}

// Choosing a plan allocates nothing.
func TestPlansAllocateNothing(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"rules":[{"name":"m","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000000000,"window":"1s",
	  "plans":{"by":{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.plan"}},"values":{"free":1000000000,"pro":{"limit":999999999}}},
	  "overrides":{"by":{"header":"x-api-key"},"values":{`)
	for i := 0; i < 100_000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"key-` + strconv.Itoa(i) + `":` + strconv.Itoa(1_000_000_000-i%7))
	}
	b.WriteString(`}}}],"response":{"headers":"both"}}`)
	cfg := b.String()
	for _, key := range []string{"key-77777", "other"} {
		h := &propHost{quietHost: quietHost{now: t0, config: []byte(cfg)}, props: map[string][]byte{propPlan: []byte("pro")}}
		h.headers = [][2][]byte{{[]byte(":method"), []byte("GET")}, {[]byte(":path"), []byte("/")}, {[]byte("x-api-key"), []byte(key)}}
		vm := filter.NewVM(h)
		vm.OnContextCreate(1, 0)
		if !vm.OnConfigure(1, len(cfg)) {
			t.Fatal("configure")
		}
		id := uint32(2)
		for i := 0; i < 10; i++ {
			cycle(vm, id)
			id++
		}
		allocs := testing.AllocsPerRun(1000, func() {
			cycle(vm, id)
			id++
			h.now += 1000
		})
		if allocs != 0 {
			t.Errorf("%s: %.1f allocations per request", key, allocs)
		}
	}
}
