// Command sluice-e2e-envoy renders one Envoy bootstrap per end-to-end scenario that can run
// on Envoy, for e2e/envoy/run.sh:
//
//	sluice-e2e-envoy -out DIR [-survival FILE]
//
// writes DIR/NAME/envoy.yaml for each scenario and prints "NAME WORKERS" lines on stdout;
// with -survival, also writes the bootstrap of run.sh's survival stage to FILE.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sluice-proxy/sluice/e2e"
)

func main() {
	out := flag.String("out", "", "directory to write NAME/envoy.yaml into")
	survival := flag.String("survival", "", "also write the survival stage's bootstrap to this file")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: sluice-e2e-envoy -out DIR [-survival FILE]")
		os.Exit(2)
	}
	err := render(*out)
	if err == nil && *survival != "" {
		err = renderSurvival(*survival)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-e2e-envoy:", err)
		os.Exit(1)
	}
}

func renderSurvival(file string) error {
	y, err := e2e.RenderEnvoySurvival()
	if err != nil {
		return fmt.Errorf("survival: %v", err)
	}
	return os.WriteFile(file, y, 0o644)
}

func render(dir string) error {
	for _, sc := range e2e.Scenarios() {
		if sc.HostOnly {
			continue
		}
		y, err := e2e.RenderEnvoy(sc)
		if err != nil {
			return fmt.Errorf("%s: %v", sc.Name, err)
		}
		d := filepath.Join(dir, sc.Name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(d, "envoy.yaml"), y, 0o644); err != nil {
			return err
		}
		fmt.Printf("%s %d\n", sc.Name, e2e.ScenarioWorkers(sc))
	}
	return nil
}
