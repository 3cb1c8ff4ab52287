package e2e

import (
	"bytes"
	_ "embed"
	"strings"
	"text/template"
)

// Paths inside the Envoy container (e2e/envoy/compose.yaml mounts them).
const (
	EnvoyWasmPath   = "/etc/sluice/sluice.wasm"
	EnvoyListenPort = 10000
	EnvoyAdminPort  = 9901
)

//go:embed envoy/envoy.yaml.tmpl
var envoyTemplate string

var envoyTmpl = template.Must(template.New("envoy.yaml").Funcs(template.FuncMap{
	"indent": func(n int, s string) string {
		pad := strings.Repeat(" ", n)
		lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
		for i, l := range lines {
			lines[i] = pad + l
		}
		return strings.Join(lines, "\n")
	},
}).Parse(envoyTemplate))

// RenderEnvoy returns the Envoy bootstrap (YAML) that serves sc: a listener on
// EnvoyListenPort running sluice (EnvoyWasmPath, vm_id "sluice", sc.Config as the plugin
// configuration) in front of the cluster "upstream" (upstream:8080), admin on
// EnvoyAdminPort. The number of workers is Envoy's --concurrency, set by run.sh.
func RenderEnvoy(sc Scenario) ([]byte, error) {
	var b bytes.Buffer
	if err := envoyTmpl.Execute(&b, sc); err != nil {
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
