package filter_test

import (
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

const (
	propSub  = "metadata\x00filter_metadata\x00envoy.filters.http.jwt_authn\x00payload\x00sub"
	propPlan = "metadata\x00filter_metadata\x00envoy.filters.http.jwt_authn\x00payload\x00plan"
	propSNI  = "connection\x00requested_server_name"
)

func jwtReq(sub string, extra ...string) filtertest.Request {
	r := filtertest.Request{Source: "10.9.0.1:1", Properties: map[string]string{}}
	if sub != "" {
		r.Properties[propSub] = sub
	}
	for i := 0; i+1 < len(extra); i += 2 {
		r.Properties[extra[i]] = extra[i+1]
	}
	return r
}

func f64(x float64) string {
	return string(binary.LittleEndian.AppendUint64(nil, math.Float64bits(x)))
}

// A key from jwt_authn's metadata: each subject has its own quota, whatever
// the headers say; a request without the claim follows missing_key.
func TestMetadataKey(t *testing.T) {
	cfg := `{"rules":[{"name":"sub","key":[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}}],
	  "missing_key":"deny","algorithm":"fixed_window","limit":2,"window":"1h"}]}`
	forEachTarget(t, cfg, func(t *testing.T, n target) {
		for _, sub := range []string{"alice", "bob", f64(42)} {
			for i := 0; i < 2; i++ {
				r := jwtReq(sub)
				r.Headers = [][2]string{{"x-sub", "forged" + strings.Repeat("x", i)}}
				if got := n.do(r); got.Status != 200 {
					t.Fatalf("%q request %d: %d", sub, i, got.Status)
				}
			}
			if got := n.do(jwtReq(sub)); got.Status != 429 {
				t.Errorf("%q third request: %d, want 429", sub, got.Status)
			}
		}
		if got := n.do(jwtReq("carol")); got.Status != 200 {
			t.Errorf("carol: %d", got.Status)
		}
	})
}

// A request without the claim follows missing_key; a condition on a value the request does
// not have does not hold. (Natively: the emulator cannot unset a property.)
func TestMetadataMissing(t *testing.T) {
	n := startNative(t, `{"rules":[{"name":"sub","key":[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}}],
	  "missing_key":"deny","algorithm":"fixed_window","limit":2,"window":"1h"},
	  {"name":"pro","match":{"metadata":[{"namespace":"envoy.filters.http.jwt_authn","path":"payload.plan","exact":"pro"}]},
	  "key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`, t0)
	if got := n.do(jwtReq("alice")); got.Status != 200 {
		t.Errorf("alice: %d", got.Status)
	}
	if got := n.do(jwtReq("")); got.Status != 429 {
		t.Errorf("no claim: %d, want 429 (missing_key deny)", got.Status)
	}
	for i := 0; i < 2; i++ {
		if got := n.do(jwtReq(strconv.Itoa(i))); got.Status != 200 {
			t.Errorf("no plan %d: %d, want the pro rule not to apply", i, got.Status)
		}
	}
}

// Match conditions on metadata and attributes.
func TestMetadataMatchFilter(t *testing.T) {
	cfg := `{"rules":[{"name":"pro","match":{"metadata":[{"namespace":"envoy.filters.http.jwt_authn","path":"payload.plan","exact":"pro"}],
	    "attributes":[{"name":"connection.requested_server_name","exact":"api.example.com"}]},
	  "key":[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	forEachTarget(t, cfg, func(t *testing.T, n target) {
		pro := jwtReq("a", propPlan, "pro", propSNI, "api.example.com")
		if n.do(pro).Status != 200 || n.do(pro).Status != 429 {
			t.Error("pro plan on api.example.com is not limited to 1")
		}
		for _, r := range []filtertest.Request{jwtReq("a", propPlan, "free", propSNI, "api.example.com"), jwtReq("a", propPlan, "pro", propSNI, "www.example.com")} {
			if got := n.do(r); got.Status != 200 {
				t.Errorf("%v: %d, want the rule not to apply", r.Properties, got.Status)
			}
		}
	})
}

// propHost answers properties from a fixed table, allocation-free.
type propHost struct {
	quietHost
	props map[string][]byte
}

func (h *propHost) GetProperty(p string) ([]byte, abi.Status) {
	if v, ok := h.props[p]; ok {
		return v, abi.StatusOK
	}
	return nil, abi.StatusNotFound
}

// Reading metadata allocates nothing per request.
func TestMetadataAllocatesNothing(t *testing.T) {
	cfg := `{"rules":[{"name":"m","match":{"metadata":[{"namespace":"envoy.filters.http.jwt_authn","path":"payload.plan","exact":"pro"}]},
	  "key":[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}},{"attribute":"xds.route_name"}],
	  "algorithm":"token_bucket","limit":1000000000,"window":"1s"}]}`
	h := &propHost{quietHost: quietHost{now: t0, config: []byte(cfg)}, props: map[string][]byte{
		propSub: []byte("alice"), propPlan: []byte("pro"), "xds\x00route_name": []byte("api")}}
	h.headers = [][2][]byte{{[]byte(":method"), []byte("GET")}, {[]byte(":path"), []byte("/")}}
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
	h.added = 0
	allocs := testing.AllocsPerRun(1000, func() {
		cycle(vm, id)
		id++
		h.now += 1000
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per request", allocs)
	}
	if h.added == 0 {
		t.Error("the rule did not apply")
	}
}

// Whatever bytes the proxy hands back for metadata (any length, any encoding), the data path
// neither panics nor fails: a value keys or is missing, and a plan is found or not.
func FuzzMetadataValues(f *testing.F) {
	f.Add([]byte("alice"), []byte("pro"))
	f.Add([]byte{}, []byte{0, 0, 0, 0, 0, 0, 0x45, 0x40})
	f.Add([]byte{0xff, 0xfe, 0}, []byte("\x01\x00\x00\x00\x03\x00\x00\x00"))
	cfg := `{"rules":[{"name":"m","match":{"metadata":[{"namespace":"envoy.filters.http.jwt_authn","path":"payload.plan","absent":true}]},
	  "key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1000,"window":"1h"},
	  {"name":"p","key":[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}}],"missing_key":"shared",
	   "algorithm":"token_bucket","limit":5,"window":"1m",
	   "plans":{"by":{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.plan"}},"values":{"pro":9,"\u0000":2},"default":"pro"}}]}`
	f.Fuzz(func(t *testing.T, sub, plan []byte) {
		n := startNative(t, cfg, t0)
		r := jwtReq(string(sub), propPlan, string(plan))
		for i := 0; i < 3; i++ {
			if got := n.do(r); got.Status != 200 && got.Status != 429 {
				t.Fatalf("status %d", got.Status)
			}
		}
	})
}

// setProperties sets the request's further properties in the emulator, which can neither
// unset one nor set it empty: a request must give every property an earlier one gave.
func (p *proxytestTarget) setProperties(props map[string]string) {
	if p.props == nil {
		p.props = map[string]bool{}
	}
	for k := range p.props {
		if _, ok := props[k]; !ok {
			p.t.Fatalf("the emulator cannot unset the property %q a previous request set", k)
		}
	}
	for k, v := range props {
		p.props[k] = true
		if err := p.host.SetProperty(strings.Split(k, "\x00"), []byte(v)); err != nil {
			p.t.Fatal(err)
		}
	}
}
