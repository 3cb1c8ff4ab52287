// Command sluice-envoy runs sluice.wasm, or libsluice.so (the dynamic module), in a real
// Envoy on this machine (make envoy-run, make envoy-run ARTIFACT=dynmod), or fetches the
// pinned Envoy binaries the tests use (make envoy-fetch, .ci/run):
//
//	sluice-envoy [-version 1.40.0 | -envoy PATH] [-wasm dist/sluice.wasm | -dynmod dist/libsluice.so]
//	             [-bootstrap envoy/envoy.yaml] [-upstream 127.0.0.1:8081] [-concurrency 2]
//	sluice-envoy -fetch
//
// Run mode takes the example bootstrap (envoy/envoy-dynmod.yaml with -dynmod), points its
// module at -wasm (or Envoy's ENVOY_DYNAMIC_MODULES_SEARCH_PATH at -dynmod's directory) and its cluster
// "upstream" at -upstream (where, unless something already listens there, it serves a
// small echo upstream itself), starts Envoy in the foreground and stops it on Ctrl-C.
// -fetch fetches every version of ENVOY_VERSIONS (default: the versions CI runs) into the
// cache (e2e/envoyproc), checks each has V8, and prints "VERSION PATH" per binary.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

func main() {
	version := flag.String("version", "1.40.0", "pinned Envoy version to run (fetched when not cached)")
	bin := flag.String("envoy", "", "an Envoy binary to run instead of a pinned version")
	wasm := flag.String("wasm", "dist/sluice.wasm", "the module")
	dynmod := flag.String("dynmod", "", "run the dynamic module (a libsluice.so) instead of the Wasm module")
	bootstrap := flag.String("bootstrap", "", "the Envoy bootstrap (its module path and upstream are rewritten; default envoy/envoy.yaml, envoy/envoy-dynmod.yaml with -dynmod)")
	upstream := flag.String("upstream", "127.0.0.1:8081", "the upstream's address")
	conc := flag.Int("concurrency", 2, "Envoy worker threads")
	fetch := flag.Bool("fetch", false, "fetch and check the pinned binaries, print their paths, and exit")
	flag.Parse()
	if flag.NArg() > 0 {
		fail(errors.New("unexpected arguments: " + strings.Join(flag.Args(), " ")))
	}
	if *fetch {
		fail(fetchAll())
		return
	}
	if *bootstrap == "" {
		*bootstrap = "envoy/envoy.yaml"
		if *dynmod != "" {
			*bootstrap = "envoy/envoy-dynmod.yaml"
		}
	}
	fail(run(*version, *bin, *wasm, *dynmod, *bootstrap, *upstream, *conc))
}

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-envoy:", err)
		os.Exit(1)
	}
}

func fetchAll() error {
	ts, err := envoyproc.Targets()
	if err != nil {
		return err
	}
	for _, t := range ts {
		dir, err := os.MkdirTemp("", "sluice-envoy-")
		if err != nil {
			return err
		}
		err = envoyproc.CheckV8(t, dir)
		os.RemoveAll(dir)
		if err != nil {
			return err
		}
		fmt.Println(t.Version, t.Bin)
	}
	return nil
}

func run(version, bin, wasm, dynmod, bootstrap, upstream string, conc int) error {
	t := envoyproc.Target{Version: version, Bin: bin}
	if bin == "" {
		b, err := envoyproc.Binary(version)
		if err != nil {
			return err
		}
		t.Bin = b
	} else if v, err := envoyproc.Version(bin); err == nil {
		t.Version = v
	}
	module := wasm
	if dynmod != "" {
		module = dynmod
		if filepath.Base(dynmod) != "libsluice.so" {
			return fmt.Errorf("-dynmod %s: the bootstrap loads the module by its name, sluice: the file must be libsluice.so", dynmod)
		}
	}
	wasmAbs, err := filepath.Abs(module)
	if err != nil {
		return err
	}
	if _, err := os.Stat(wasmAbs); err != nil {
		return fmt.Errorf("%v (build it with make build)", err)
	}
	y, err := os.ReadFile(bootstrap)
	if err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(upstream)
	if err != nil {
		return fmt.Errorf("-upstream %q: %v", upstream, err)
	}
	if _, err := strconv.Atoi(port); err != nil {
		return fmt.Errorf("-upstream %q: port %q", upstream, port)
	}
	s := string(y)
	rewrites := map[string]string{
		"{address: upstream, port_value: 8080}":         "{address: " + host + ", port_value: " + port + "}",
		"socket_address: {address: 0.0.0.0, port_value": "socket_address: {address: 127.0.0.1, port_value",
	}
	var env []string
	if dynmod == "" {
		rewrites["filename: /etc/envoy/sluice.wasm"] = "filename: " + strconv.Quote(wasmAbs)
	} else {
		env = []string{"ENVOY_DYNAMIC_MODULES_SEARCH_PATH=" + filepath.Dir(wasmAbs)}
	}
	for old, repl := range rewrites {
		if !strings.Contains(s, old) {
			return fmt.Errorf("%s: no %q to rewrite", bootstrap, old)
		}
		s = strings.ReplaceAll(s, old, repl)
	}
	if l, err := net.Listen("tcp", upstream); err == nil {
		fmt.Printf("sluice-envoy: echo upstream on http://%s\n", upstream)
		go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "upstream: %s %s\n", r.Method, r.URL.Path)
		}))
	} else {
		fmt.Printf("sluice-envoy: %s is taken; using it as the upstream\n", upstream)
	}
	dir, err := os.MkdirTemp("", "sluice-envoy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e, err := envoyproc.Start(context.Background(), t, envoyproc.Options{Bootstrap: []byte(s), Concurrency: conc, Dir: dir,
		LogLevel: "info", Env: env})
	if err != nil {
		return err
	}
	defer e.Stop()
	if dynmod == "" {
		if ok, err := e.HasV8(); err != nil || !ok {
			return fmt.Errorf("envoy %s has no V8 runtime (%v)", t.Version, err)
		}
	}
	u, err := e.URL("ingress")
	if err != nil {
		return err
	}
	fmt.Printf("sluice-envoy: Envoy %s (%s) with %s\n  listener %s\n  admin    %s  (try %s/stats?filter=sluice)\nCtrl-C stops it.\n",
		t.Version, t.Bin, wasmAbs, u, e.Admin, e.Admin)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	select {
	case <-sig:
		return nil
	case <-e.Exited():
		return fmt.Errorf("envoy exited (%v); its log:\n%s", e.ExitErr(), e.Log())
	}
}
