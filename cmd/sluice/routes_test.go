package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// `sluice run --route NAME=PATH_PREFIX --route-cluster NAME=CLUSTER`: the filter sees the
// route of the longest matching prefix as xds.route_name (and route_name with --profile
// higress), and its cluster as xds.cluster_name / cluster_name.
func TestRunRoutes(t *testing.T) {
	for _, profile := range []string{"envoy-1.33", "higress"} {
		parseRouteFlags(t, "--route", "all=/", "--route", "props=/props", "--route", "pr=/pr",
			"--route-cluster", "props=outbound|8080||props.default.svc.cluster.local")
		rs, _, _ := startTestRun(t, runConfig{wasm: buildWasm(t, kitchenDir), clusters: clusterFlag{}, profile: profile, logLevel: "info"})
		_, body := httpGet(t, "http://"+rs.listenAddr+"/props?x=1")
		want := []string{"xds.route_name=props;0", "xds.cluster_name=outbound|8080||props.default.svc.cluster.local;0"}
		if profile == "higress" {
			want = append(want, "route_name=props;0", "cluster_name=outbound|8080||props.default.svc.cluster.local;0")
		} else {
			want = append(want, "route_name=;1", "cluster_name=;1")
		}
		for _, w := range want {
			if !strings.Contains(body, w+"\n") {
				t.Errorf("%s: missing %q in\n%s", profile, w, body)
			}
		}
	}
}

// parseRouteFlags parses route flags into runRoutes, emptied again when the test ends.
func parseRouteFlags(t *testing.T, args ...string) {
	t.Helper()
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	routeFlags(fs)
	t.Cleanup(func() { routeFlags(flag.NewFlagSet("reset", flag.ContinueOnError)) })
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
}

func TestRunRouteFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--route", "a"}, "want NAME=PATH_PREFIX"},
		{[]string{"--route", "=/"}, "want NAME=PATH_PREFIX"},
		{[]string{"--route", "a=x"}, "must start with /"},
		{[]string{"--route", "a=/x?y"}, "must start with /"},
		{[]string{"--route", "a\x01=/x"}, "control characters"},
		{[]string{"--route", "a=/x", "--route", "b=/x"}, `path prefix "/x" given twice (routes "a" and "b")`},
		{[]string{"--route-cluster", "a"}, "want ROUTE=CLUSTER"},
		{[]string{"--route-cluster", "a=c", "--route-cluster", "a=d"}, `route "a": cluster given twice`},
	} {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		routeFlags(fs)
		err := fs.Parse(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.args, err, c.want)
		}
	}
	// A cluster for a route that is not named is an error at start.
	parseRouteFlags(t, "--route", "a=/", "--route-cluster", "b=c")
	var out, errOut syncBuffer
	_, err := startRun(t.Context(), runConfig{wasm: buildWasm(t, kitchenDir), clusters: clusterFlag{}, workers: 1, logLevel: "info", memoryMB: 64, listen: "127.0.0.1:0"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), `--route-cluster "b": no --route of that name`) {
		t.Errorf("startRun: %v", err)
	}
}
