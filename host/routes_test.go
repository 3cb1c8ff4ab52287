package host

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The route and cluster properties: xds.* in every profile, the older route_name and
// cluster_name only where the modelled proxy has them (Higress's Envoy; upstream Envoy
// removed them in 1.33). The route comes from Options.Routes by the longest path prefix, or
// from Request.RouteName.
func TestRouteProperties(t *testing.T) {
	routes := []Route{
		{Name: "all", PathPrefix: "/"},
		{Name: "short", PathPrefix: "/pr", Cluster: "outbound|80||short.default.svc.cluster.local"},
		{Name: "props", PathPrefix: "/props", Cluster: "outbound|8080||props.default.svc.cluster.local"},
	}
	cases := []struct {
		profile string
		req     Request
		want    []string
	}{
		// The longest prefix of the path before '?' wins.
		{"envoy-1.33", Request{Path: "/props?x=/other"}, []string{
			"xds.route_name=props;0", "xds.cluster_name=outbound|8080||props.default.svc.cluster.local;0",
			"route_name=;1", "cluster_name=;1"}},
		{"cpphost-533", Request{Path: "/props"}, []string{"xds.route_name=props;0", "route_name=;1"}},
		{"higress", Request{Path: "/props"}, []string{
			"xds.route_name=props;0", "route_name=props;0", "cluster_name=outbound|8080||props.default.svc.cluster.local;0"}},
		// Request.RouteName wins over Options.Routes; ClusterName is given or absent.
		{"envoy-1.33", Request{Path: "/props", RouteName: "given"}, []string{"xds.route_name=given;0", "xds.cluster_name=;1"}},
		{"higress", Request{Path: "/props", RouteName: "given", ClusterName: "c"}, []string{"route_name=given;0", "cluster_name=c;0"}},
	}
	for _, tc := range cases {
		h, _ := newHost(t, "kitchen", Options{Workers: 1, Profile: tc.profile, Routes: routes})
		req := tc.req
		resp := mustExchange(t, h, &req, nil)
		for _, w := range tc.want {
			if !strings.Contains(string(resp.Body), w+"\n") {
				t.Errorf("%s %+v: missing %q in\n%s", tc.profile, tc.req, w, resp.Body)
			}
		}
	}
	// No route at all: every route property is NOT_FOUND.
	h, _ := newHost(t, "kitchen", Options{Workers: 1, Profile: "higress"})
	resp := mustExchange(t, h, &Request{Path: "/props"}, nil)
	for _, w := range []string{"xds.route_name=;1", "xds.cluster_name=;1", "route_name=;1", "cluster_name=;1"} {
		if !strings.Contains(string(resp.Body), w+"\n") {
			t.Errorf("no routes: missing %q in\n%s", w, resp.Body)
		}
	}
}

// Handler (sluice run) routes by the request's path the same way.
func TestRoutePropertiesHandler(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1, Routes: []Route{{Name: "p", PathPrefix: "/props", Cluster: "c1"}}})
	srv := httptest.NewServer(h.Handler(http.NotFoundHandler()))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/props?a=b")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, w := range []string{"xds.route_name=p;0", "xds.cluster_name=c1;0", "route_name=;1"} {
		if !strings.Contains(string(body), w+"\n") {
			t.Errorf("missing %q in\n%s", w, body)
		}
	}
}

func TestRouteLongestPrefix(t *testing.T) {
	h := &Host{opts: Options{Routes: []Route{
		{Name: "all", PathPrefix: "/"}, {Name: "api", PathPrefix: "/api/", Cluster: "c"}, {Name: "v2", PathPrefix: "/api/v2"},
	}}}
	for _, c := range []struct{ path, name, cluster string }{
		{"/", "all", ""}, {"/api", "all", ""}, {"/api/x", "api", "c"}, {"/api/v2/x", "v2", ""}, {"/api/v2", "v2", ""},
		{"/api/x?q=/api/v2", "api", "c"}, {"x", "", ""},
	} {
		if n, cl := h.route(c.path); n != c.name || cl != c.cluster {
			t.Errorf("route(%q) = %q, %q; want %q, %q", c.path, n, cl, c.name, c.cluster)
		}
	}
}

func TestRoutesChecked(t *testing.T) {
	for _, c := range []struct {
		routes []Route
		want   string
	}{
		{[]Route{{Name: "", PathPrefix: "/"}}, "empty name"},
		{[]Route{{Name: "a", PathPrefix: "x"}}, `path prefix "x" does not start with /`},
		{[]Route{{Name: "a", PathPrefix: "/a"}, {Name: "b", PathPrefix: "/a"}}, `path prefix "/a" given twice`},
	} {
		_, err := New(context.Background(), Options{Wasm: guest(t, "minimal"), Routes: c.routes})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.routes, err, c.want)
		}
	}
}
