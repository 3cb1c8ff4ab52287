// Command sluice-images writes the OCI images of sluice (`make images`): the Wasm modules
// as Istio's and Higress's WasmPlugin fetchers take them, and the `sluice serve` image, as
// OCI image layouts and docker-loadable tarballs under -out. No Docker and no registry:
// every input is a file built beforehand, and the images are built from nothing (no base
// image is pulled).
//
// It is a command of its own, not a `sluice` subcommand, so that dist/sluice carries no
// image-writing code (go-containerregistry) that its users would never run.
//
//	sluice-images -out dist/images -wasm dist/sluice.wasm -redis-wasm dist/sluice-redis.wasm \
//	    -serve linux/amd64=dist/images/bin/linux-amd64/sluice [-serve linux/arm64=…] [-tag 0.1.0]
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sluice-proxy/sluice/internal/images"
)

type platformFlag map[string]string

func (p platformFlag) String() string { return fmt.Sprint(map[string]string(p)) }

func (p platformFlag) Set(v string) error {
	pl, path, ok := strings.Cut(v, "=")
	if !ok || pl == "" || path == "" {
		return fmt.Errorf("want OS/ARCH=PATH, got %q", v)
	}
	p[pl] = path
	return nil
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	opts := images.Options{Serve: platformFlag{}}
	fs := flag.NewFlagSet("sluice-images", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&opts.Dir, "out", "dist/images", "output directory")
	fs.StringVar(&opts.Registry, "registry", images.Registry, "registry and namespace the images are named for")
	fs.StringVar(&opts.Tag, "tag", images.Version, "tag of every image (envoy/'s manifests name "+images.Version+")")
	fs.StringVar(&opts.Wasm, "wasm", "dist/sluice.wasm", "sluice.wasm")
	fs.StringVar(&opts.RedisWasm, "redis-wasm", "dist/sluice-redis.wasm", "sluice-redis.wasm")
	fs.Var(platformFlag(opts.Serve), "serve", "OS/ARCH=PATH: a static sluice binary for that platform (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice-images: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	created, err := images.CreatedFromEnv()
	if err != nil {
		fmt.Fprintf(stderr, "sluice-images: %v\n", err)
		return 2
	}
	opts.Created = created
	out, err := images.Build(opts)
	if err != nil {
		fmt.Fprintf(stderr, "sluice-images: %v\n", err)
		return 1
	}
	for _, w := range out {
		fmt.Fprintf(stdout, "%s  %s@%s\n", w.Ref, w.Ref.Context(), w.Digest)
		fmt.Fprintf(stdout, "  layout  %s\n", w.Layout)
		for _, t := range w.Tarball {
			fmt.Fprintf(stdout, "  tarball %s\n", t)
		}
	}
	return 0
}
