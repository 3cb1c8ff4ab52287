package envoy

import (
	"bytes"
	"os"
	"strings"
	"testing"

	networkingv1 "istio.io/api/networking/v1"

	"github.com/sluice-proxy/sluice/config"
)

// loadVirtualService parses an Istio VirtualService strictly (see loadIstio).
func loadVirtualService(data []byte) (*networkingv1.VirtualService, error) {
	var vs networkingv1.VirtualService
	if err := loadIstio(data, "networking.istio.io/v1", "VirtualService", &vs); err != nil {
		return nil, err
	}
	return &vs, nil
}

// envoyRouteNames returns the Envoy route names Istio builds from vs (pilot's
// translateRoute: http[].name, or "name.match-name" for a match with a name).
func envoyRouteNames(vs *networkingv1.VirtualService) map[string]bool {
	names := map[string]bool{}
	for _, h := range vs.GetHttp() {
		if len(h.GetMatch()) == 0 {
			names[h.GetName()] = true
		}
		for _, m := range h.GetMatch() {
			if m.GetName() != "" {
				names[h.GetName()+"."+m.GetName()] = true
			} else {
				names[h.GetName()] = true
			}
		}
	}
	return names
}

// checkIstioRoutes checks istio-routes.yaml (or a variant): the VirtualService and the
// WasmPlugin against istio.io/api, the pluginConfig with sluice.wasm's validation, and that
// each route the rules name is one the VirtualService gives Envoy.
func checkIstioRoutes(data []byte) (*config.Config, error) {
	docs := bytes.Split(data, []byte("\n---\n"))
	if len(docs) != 2 {
		return nil, &multiError{[]string{"want two documents, VirtualService and WasmPlugin"}}
	}
	vs, err := loadVirtualService(docs[0])
	if err != nil {
		return nil, err
	}
	wp, err := loadWasmPlugin(docs[1])
	if err != nil {
		return nil, err
	}
	js, err := pluginConfigJSON(wp)
	if err != nil {
		return nil, err
	}
	cfg, err := config.ParseFor(js, config.BuildLocal)
	if err != nil {
		return nil, err
	}
	names := envoyRouteNames(vs)
	var problems []string
	for _, r := range cfg.Rules {
		for _, name := range r.Match.Routes {
			if !names[name] {
				problems = append(problems, "rule "+r.Name+": no route named "+name+" in the VirtualService")
			}
		}
	}
	if len(problems) > 0 {
		return nil, &multiError{problems}
	}
	return cfg, nil
}

func TestIstioRoutes(t *testing.T) {
	data, err := os.ReadFile("istio-routes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := checkIstioRoutes(data)
	if err != nil {
		t.Fatalf("istio-routes.yaml: %v", err)
	}
	if len(cfg.Rules) != 2 || strings.Join(cfg.Rules[0].Match.Routes, ",") != "checkout,cart" || len(cfg.Rules[1].Match.Routes) != 0 {
		t.Errorf("rules %+v", cfg.Rules)
	}
	vs, _ := loadVirtualService(bytes.Split(data, []byte("\n---\n"))[0])
	if got := envoyRouteNames(vs); len(got) != 3 || !got["checkout"] || !got["cart"] || !got["web"] {
		t.Errorf("route names %v", got)
	}
}

func TestIstioRoutesMistakesFail(t *testing.T) {
	data, err := os.ReadFile("istio-routes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, old, new, want string }{
		{"typo in VirtualService", "gateways:", "gateway:", "gateway"},
		{"VirtualService kind", "kind: VirtualService", "kind: VirtualServce", "not a networking.istio.io/v1 VirtualService"},
		{"route renamed", "  - name: cart\n", "  - name: basket\n", "no route named cart"},
		{"unknown route in rules", "routes: [checkout, cart]", "routes: [checkout, kart]", "no route named kart"},
		{"empty route name", "routes: [checkout, cart]", `routes: [checkout, ""]`, "rules[0].match.routes[1]"},
		{"routes not a list", "routes: [checkout, cart]", "routes: checkout", "rules[0].match.routes"},
		{"typo in WasmPlugin", "failStrategy: FAIL_OPEN", "failStrategie: FAIL_OPEN", "failStrategie"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(string(data), c.old) {
				t.Fatalf("istio-routes.yaml does not contain %q", c.old)
			}
			_, err := checkIstioRoutes([]byte(strings.Replace(string(data), c.old, c.new, 1)))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one mentioning %q", err, c.want)
			}
		})
	}
}
