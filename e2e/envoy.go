package e2e

import (
	"bytes"
	_ "embed"
	"sort"
	"strconv"
	"strings"
	"text/template"
)

// EnvoySite is where a rendered bootstrap finds what it needs on the machine Envoy runs on.
type EnvoySite struct {
	WasmPath     string // the module, as `make build` ships it
	UpstreamPort int    // the test's upstream on 127.0.0.1 (HTTP/1.1 and h2c)
	// DynamicModule, when set, is the name of the dynamic module (libNAME.so in Envoy's
	// ENVOY_DYNAMIC_MODULES_SEARCH_PATH) that serves as sluice instead of WasmPath.
	DynamicModule string
}

//go:embed envoy/envoy.yaml.tmpl
var envoyTemplate string

var envoyTmpl = template.Must(template.New("envoy.yaml").Funcs(template.FuncMap{
	"quote": strconv.Quote,
	"indent": func(n int, s string) string {
		pad := strings.Repeat(" ", n)
		lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
		for i, l := range lines {
			lines[i] = pad + l
		}
		return strings.Join(lines, "\n")
	},
}).Parse(envoyTemplate))

// envoyBootstrap is what envoy/envoy.yaml.tmpl renders.
type envoyBootstrap struct {
	EnvoySite
	Name   string // the scenario or stage, for the header comment
	Config string // the plugin configuration
	// ExactBalance gives the listener exact connection balance across workers.
	ExactBalance bool
	// MaxRequestHeadersKB, when nonzero, is the connection manager's
	// max_request_headers_kb (Envoy's default: 60).
	MaxRequestHeadersKB int
	// Routes are the named routes, longest prefix first (Envoy takes the first route that
	// matches), before the unnamed catch-all unless one of them is "/".
	Routes   []Route
	CatchAll bool
	// AllowStopIteration sets the Wasm PluginConfig's allow_on_headers_stop_iteration
	// (Envoy ≥ 1.35): paused request headers let the body through to the filter.
	AllowStopIteration bool
	// AccessLogPath, when set, adds a JSON access log there with sluice's decision.
	AccessLogPath string
}

// RenderEnvoy returns the Envoy bootstrap (YAML) that serves sc: a listener "ingress" on a
// free 127.0.0.1 port running sluice (site.WasmPath, vm_id "sluice", sc.Config as the
// plugin configuration) in front of the cluster "upstream" (127.0.0.1:site.UpstreamPort),
// admin on a free port, with sc.Routes as named routes. The number of workers is Envoy's
// --concurrency, set by the harness; scenarios with bursts get exact connection balance.
func RenderEnvoy(sc Scenario, site EnvoySite) ([]byte, error) {
	routes := append([]Route(nil), sc.Routes...)
	sort.SliceStable(routes, func(i, j int) bool { return len(routes[i].PathPrefix) > len(routes[j].PathPrefix) })
	catchAll := true
	for _, r := range routes {
		if r.PathPrefix == "/" {
			catchAll = false
		}
	}
	exact := false
	for _, st := range sc.Steps {
		exact = exact || st.Burst != nil
	}
	return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: sc.Name, Config: sc.Config, Routes: routes, CatchAll: catchAll, ExactBalance: exact})
}

// The survival stage of the Envoy suite: the attack that killed earlier builds in a
// cpp-host before PR #533 (Envoy 1.33–1.38). Two rules keyed on x-api-key, far above what
// the stage sends, so every request must be admitted; x-api-key values of 33 KiB and 96 KiB;
// one worker, so one VM takes every request. Envoy's default max_request_headers_kb (60)
// would answer 431 to the 96 KiB value before sluice sees it, so the stage raises the limit
// (the test's upstream accepts what Envoy forwards).
const (
	SurvivalWorkers             = 1
	SurvivalMaxRequestHeadersKB = 128
	SurvivalConfig              = `{
  "rules": [
    {"name": "survival-a", "key": [{"header": "x-api-key"}], "algorithm": "token_bucket", "limit": 1000000, "window": "1h"},
    {"name": "survival-b", "key": [{"header": "x-api-key"}], "algorithm": "sliding_window", "limit": 1000000, "window": "1h"}
  ],
  "failure_mode": "closed"
}`
)

// RenderEnvoySurvival returns the bootstrap of the survival stage: RenderEnvoy's, with
// SurvivalConfig and max_request_headers_kb SurvivalMaxRequestHeadersKB.
func RenderEnvoySurvival(site EnvoySite) ([]byte, error) {
	return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "survival", Config: SurvivalConfig, MaxRequestHeadersKB: SurvivalMaxRequestHeadersKB, CatchAll: true})
}

func renderEnvoy(data envoyBootstrap) ([]byte, error) {
	var b bytes.Buffer
	if err := envoyTmpl.Execute(&b, data); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// ScenarioWorkers is the number of workers (VMs) sc runs with.
func ScenarioWorkers(sc Scenario) int {
	if sc.Workers == 0 {
		return 2
	}
	return sc.Workers
}
