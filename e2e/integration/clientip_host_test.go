package integration

import (
	"strconv"
	"testing"

	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// A client that shares the trusted proxy's address (same host, SNAT) and
// writes its own X-Forwarded-For entries is held to its limit, through the
// compiled module in the embedded host: 50 requests, each with a fresh forged
// entry, limit 5 → exactly 5 admitted. The old filter skipped a right-most
// entry equal to the peer ("Envoy appended it") and keyed on the forged one:
// 35 of 50 admitted. Which entry is the client is configuration only, so
// clients behind the proxy still get a limit each.
func TestHostColocatedClientHeldToLimit(t *testing.T) {
	const proxy = "10.0.0.5" // the trusted proxy in front, and the co-located client
	for _, c := range []struct {
		name, clientIP string
		// xff is what reaches the filter when the proxy in front wrote
		// client (its peer) after the client's own forged entry.
		xff func(forged, client string) [][2]string
	}{
		// The embedded host appends nothing before the filter (like Envoy
		// with use_remote_address: false, or skip_xff_append: true).
		{"one-header", `{"xff_trusted_hops":1}`, func(forged, client string) [][2]string {
			return [][2]string{{"x-forwarded-for", forged + ", " + client}}
		}},
		// The forged entry in a header of its own before the one the proxy
		// added (HAProxy adds a header): both are read, as one list.
		{"two-headers", `{"xff_trusted_hops":1}`, func(forged, client string) [][2]string {
			return [][2]string{{"x-forwarded-for", forged}, {"x-forwarded-for", client}}
		}},
		// This proxy appends its peer too (Envoy with use_remote_address).
		{"proxy-appends", `{"xff_trusted_hops":1,"proxy_appends_xff":true}`, func(forged, client string) [][2]string {
			return [][2]string{{"x-forwarded-for", forged + ", " + client + ", " + proxy}}
		}},
		// Two trusted proxies in front: the outer one wrote the client.
		{"two-hops", `{"xff_trusted_hops":2}`, func(forged, client string) [][2]string {
			return [][2]string{{"x-forwarded-for", forged + ", " + client + ", " + proxy}}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := `{"rules":[{"name":"per-ip","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":5,"window":"1h"}],"client_ip":` + c.clientIP + `}`
			ht := startHost(t, cfg, 2)
			admitted := 0
			for i := 0; i < 50; i++ {
				forged := "203.0.113." + strconv.Itoa(i)
				r := ht.do(filtertest.Request{Method: "GET", Path: "/", Source: proxy + ":" + strconv.Itoa(40000+i), Headers: c.xff(forged, proxy)})
				if r.Status == 200 {
					admitted++
				}
			}
			if admitted != 5 {
				t.Errorf("co-located client: %d of 50 admitted, want 5", admitted)
			}
			for i := 1; i <= 3; i++ {
				client := "198.51.100." + strconv.Itoa(i)
				r := ht.do(filtertest.Request{Method: "GET", Path: "/", Source: proxy + ":1", Headers: c.xff("203.0.113.1", client)})
				if r.Status != 200 {
					t.Errorf("client %s behind the proxy: status %d, want its own limit", client, r.Status)
				}
			}
			if st := ht.h.Stats(); st.VMRestarts != 0 || st.Failed != 0 {
				t.Errorf("restarts %d failed %d", st.VMRestarts, st.Failed)
			}
		})
	}
}
