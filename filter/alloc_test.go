package filter_test

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// quietHost is an allocation-free abi.Host for one client and a handful of
// shared-data keys, so that testing.AllocsPerRun counts only the filter's
// own allocations (the same Go code the wasm module runs).
type quietHost struct {
	now     int64
	config  []byte
	headers [][2][]byte
	pairs   []byte
	source  []byte
	keys    [8][]byte
	vals    [8][]byte
	cas     [8]uint32
	n       int
	next    uint32
	local   int
	added   int
}

func (h *quietHost) Log(abi.LogLevel, string) {}
func (h *quietHost) GetBuffer(bt abi.BufferType, start, max int) ([]byte, abi.Status) {
	return h.config, abi.StatusOK
}
func (h *quietHost) GetHeader(mt abi.MapType, name string) ([]byte, abi.Status) {
	for _, kv := range h.headers {
		if string(kv[0]) == name {
			return kv[1], abi.StatusOK
		}
	}
	return nil, abi.StatusNotFound
}
func (h *quietHost) GetHeaderPairs(abi.MapType) ([]byte, abi.Status) {
	h.pairs = h.pairs[:0]
	h.pairs = binary.LittleEndian.AppendUint32(h.pairs, uint32(len(h.headers)))
	for _, kv := range h.headers {
		h.pairs = binary.LittleEndian.AppendUint32(h.pairs, uint32(len(kv[0])))
		h.pairs = binary.LittleEndian.AppendUint32(h.pairs, uint32(len(kv[1])))
	}
	for _, kv := range h.headers {
		h.pairs = append(append(append(append(h.pairs, kv[0]...), 0), kv[1]...), 0)
	}
	return h.pairs, abi.StatusOK
}
func (h *quietHost) AddHeader(abi.MapType, string, []byte) abi.Status { h.added++; return abi.StatusOK }
func (h *quietHost) GetProperty(string) ([]byte, abi.Status)          { return h.source, abi.StatusOK }
func (h *quietHost) SendLocalResponse(int, string, []byte, []abi.Header, int32) abi.Status {
	h.local++
	return abi.StatusOK
}
func (h *quietHost) find(key []byte) int {
	for i := 0; i < h.n; i++ {
		if bytes.Equal(h.keys[i], key) {
			return i
		}
	}
	return -1
}
func (h *quietHost) GetSharedData(key []byte) ([]byte, uint32, abi.Status) {
	if i := h.find(key); i >= 0 {
		return h.vals[i], h.cas[i], abi.StatusOK
	}
	return nil, 0, abi.StatusNotFound
}
func (h *quietHost) SetSharedData(key, value []byte, cas uint32) abi.Status {
	i := h.find(key)
	if i < 0 {
		i = h.n
		h.n++
		h.keys[i] = append([]byte(nil), key...)
	} else if cas != 0 && cas != h.cas[i] {
		return abi.StatusCASMismatch
	}
	h.vals[i] = append(h.vals[i][:0], value...)
	h.next++
	h.cas[i] = h.next
	return abi.StatusOK
}
func (h *quietHost) DefineMetric(abi.MetricType, string) (uint32, abi.Status) { return 1, abi.StatusOK }
func (h *quietHost) IncrementMetric(uint32, int64) abi.Status                 { return abi.StatusOK }
func (h *quietHost) Now() int64                                               { return h.now }
func (h *quietHost) SetAttributes([]abi.Header) abi.Status                    { return abi.StatusOK }

// cycle runs one request through vm like Envoy would.
func cycle(vm *filter.VM, id uint32) {
	vm.OnContextCreate(id, 1)
	vm.OnRequestHeaders(id, 4, true)
	vm.OnResponseHeaders(id, 2, false)
	vm.OnLog(id)
	vm.OnDone(id)
	vm.OnDelete(id)
}

// The filter's data path allocates nothing per request, on the allow and
// deny paths, with every key source and both header styles.
func TestDataPathAllocatesNothing(t *testing.T) {
	// With access_log writing every decision, top keys (merged once a second: the clock
	// moves 1 ms a request) and the refusal extras.
	const observe = `,"access_log":{"key":"raw","near_limit_percent":100},"top_keys":{"size":8,"key":"raw"},"response":{"headers":"both","rule_header":"x-rule","format":"problem_json"}`
	for _, c := range []struct{ name, limit, path, clientIP string }{
		{"allow", "1000000000", "/api/x?q=1%202", ""},
		{"deny", "1", "/api/x?q=1%202", ""},
		{"allow-observed", "1000000000", "/api/x?q=1%202", observe},
		{"deny-observed", "1", "/api/x?q=1%202", observe},
		// A path that needs normalizing and a client from X-Forwarded-For
		// (read through the header-pairs call, two headers).
		{"allow-normalized-xff", "1000000000", "//api/./y/../%78?q=1%202", `,"client_ip":{"xff_trusted_hops":1,"proxy_appends_xff":true}`},
		{"deny-normalized-xff", "1", "//api/./y/../%78?q=1%202", `,"client_ip":{"xff_trusted_hops":1,"proxy_appends_xff":true}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := `{"rules":[{"name":"a","match":{"path_prefix":"/api/","methods":["GET"]},"key":[{"remote_ip":true,"ipv6_prefix":64},{"header":"x-api-key"},{"query":"q"},{"cookie":"s"},{"path":true},{"method":true}],
			  "algorithm":"sliding_window","limit":` + c.limit + `,"window":"1h"},
			  {"name":"b","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1000000000,"window":"1s"}]` + c.clientIP + `}`
			if !strings.Contains(c.clientIP, `"response"`) {
				cfg = strings.TrimSuffix(cfg, "}") + `,"response":{"headers":"both"}}`
			}
			step := int64(1000)
			if strings.HasSuffix(c.name, "-observed") {
				step = 1e6
			}
			h := &quietHost{now: t0, config: []byte(cfg), source: []byte("[2001:db8::1]:443")}
			for _, kv := range [][2]string{{":method", "GET"}, {":path", c.path}, {"x-api-key", "k"}, {"cookie", "a=1; s=2"},
				{"x-forwarded-for", "203.0.113.9"}, {"x-forwarded-for", "2001:db8::2, 2001:db8::1"}} {
				h.headers = append(h.headers, [2][]byte{[]byte(kv[0]), []byte(kv[1])})
			}
			vm := filter.NewVM(h)
			vm.OnContextCreate(1, 0)
			if !vm.OnConfigure(1, len(cfg)) {
				t.Fatal("configure")
			}
			id := uint32(2)
			for i := 0; i < 10; i++ { // warm up: create the slots, grow buffers
				cycle(vm, id)
				id++
			}
			h.local, h.added = 0, 0
			allocs := testing.AllocsPerRun(1000, func() {
				cycle(vm, id)
				id++
				h.now += step
			})
			if allocs != 0 {
				t.Errorf("%.1f allocations per request", allocs)
			}
			deny := strings.HasPrefix(c.name, "deny")
			if deny && h.local == 0 || !deny && (h.local != 0 || h.added == 0) {
				t.Errorf("path not taken: local %d added %d", h.local, h.added)
			}
		})
	}
}

// BenchmarkNativeCycle is the filter's own cost per request cycle, natively
// with an allocation-free host: the floor under BenchmarkFullCycle.
func BenchmarkNativeCycle(b *testing.B) {
	for _, c := range []struct{ name, limit string }{{"allow", "1000000000"}, {"deny", "1"}} {
		b.Run(c.name, func(b *testing.B) {
			cfg := `{"rules":[{"name":"bench","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":` + c.limit + `,"window":"1h"}],"response":{"headers":"both"}}`
			h := &quietHost{now: t0, config: []byte(cfg), source: []byte("192.0.2.10:40000")}
			vm := filter.NewVM(h)
			vm.OnContextCreate(1, 0)
			if !vm.OnConfigure(1, len(cfg)) {
				b.Fatal("configure")
			}
			id := uint32(2)
			cycle(vm, id)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id++
				cycle(vm, id)
			}
		})
	}
}
