package e2e

import (
	"testing"

	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

// The Envoy bootstrap of a scenario with Routes has the same named routes as
// `sluice run --route`: longest prefix first (Envoy takes the first match, sluice run the
// longest), then an unnamed catch-all unless a route is "/".
func TestEnvoyBootstrapRoutes(t *testing.T) {
	for _, c := range []struct {
		routes []Route
		want   [][2]string // name, prefix
	}{
		{[]Route{{"web", "/"}, {"cart", "/cart"}, {"checkout", "/checkout"}}, [][2]string{{"checkout", "/checkout"}, {"cart", "/cart"}, {"web", "/"}}},
		{[]Route{{"a", "/a"}, {"ab", "/a/b"}}, [][2]string{{"ab", "/a/b"}, {"a", "/a"}, {"", "/"}}},
		{nil, [][2]string{{"", "/"}}},
	} {
		y, err := RenderEnvoy(Scenario{Name: "t", Config: `{"rules":[{"name":"r","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1s"}]}`, Routes: c.routes}, testSite)
		if err != nil {
			t.Fatal(err)
		}
		b := parseBootstrap(t, y)
		var hcm hcmv3.HttpConnectionManager
		if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
			t.Fatal(err)
		}
		routes := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()
		if len(routes) != len(c.want) {
			t.Fatalf("%v: %d routes, want %v", c.routes, len(routes), c.want)
		}
		for i, r := range routes {
			if r.GetName() != c.want[i][0] || r.GetMatch().GetPrefix() != c.want[i][1] || r.GetRoute().GetCluster() != "upstream" {
				t.Errorf("%v: route %d is %q %q, want %v", c.routes, i, r.GetName(), r.GetMatch().GetPrefix(), c.want[i])
			}
		}
	}
	// Every scenario's routes render.
	for _, sc := range Scenarios() {
		if _, err := RenderEnvoy(sc, testSite); err != nil {
			t.Errorf("%s: %v", sc.Name, err)
		}
	}
}
