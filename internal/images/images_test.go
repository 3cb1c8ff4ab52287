package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// pluginFromImage reads the module out of img by the rules of Istio's fetcher
// (istio/istio pkg/wasm/imagefetcher.go, the same in Higress's fork): a Docker schema 2
// manifest's last layer must be a Docker gzip layer; otherwise an OCI manifest's last
// layer an OCI tar+gzip layer; in either the first entry whose base name is plugin.wasm.
// (The fetcher's third form, a raw-module layer, needs exactly two layers.)
func pluginFromImage(t *testing.T, img v1.Image) []byte {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	want := types.OCILayer
	if m.MediaType == types.DockerManifestSchema2 {
		want = types.DockerLayer
	}
	layers, err := img.Layers()
	if err != nil || len(layers) == 0 {
		t.Fatalf("layers %d, %v", len(layers), err)
	}
	l := layers[len(layers)-1]
	if mt, err := l.MediaType(); err != nil || mt != want {
		t.Fatalf("last layer's media type %q (%v), the fetcher wants %q", mt, err, want)
	}
	rc, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		t.Fatalf("the layer is not gzip: %v", err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no %s in the layer: %v", PluginFile, err)
		}
		if filepath.Base(h.Name) == PluginFile {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// layerFiles returns the regular files of img's single layer.
func layerFiles(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers, want 1 (%v)", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = h
	}
}

func fileFromLayer(t *testing.T, img v1.Image, name string) []byte {
	t.Helper()
	layers, _ := img.Layers()
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s not in the layer: %v", name, err)
		}
		if h.Name == name {
			b, _ := io.ReadAll(tr)
			return b
		}
	}
}

// checkOCIImage checks img's manifest, config and layer media types and validates it.
func checkOCIImage(t *testing.T, img v1.Image) *v1.Manifest {
	t.Helper()
	if err := validate.Image(img); err != nil {
		t.Errorf("validate: %v", err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %q, want %q", m.MediaType, types.OCIManifestSchema1)
	}
	if m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("config media type %q, want %q", m.Config.MediaType, types.OCIConfigJSON)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("layers %+v, want one %q", m.Layers, types.OCILayer)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.RootFS.Type != "layers" || len(cf.RootFS.DiffIDs) != 1 {
		t.Errorf("rootfs %+v", cf.RootFS)
	}
	return m
}

func TestWasmImage(t *testing.T) {
	module := append([]byte("\x00asm\x01\x00\x00\x00"), bytes.Repeat([]byte{7}, 5000)...)
	mem, err := WasmImage(module, "sluice.wasm", "9.9.9", Epoch)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := Ref(Registry, NameWasm, "9.9.9")
	w, err := WriteImage(t.TempDir(), NameWasm, ref, mem)
	if err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(w.Layout)
	if err != nil {
		t.Fatal(err)
	}
	img, err := p.Image(w.Digest)
	if err != nil {
		t.Fatal(err)
	}
	m := checkOCIImage(t, img)
	if m.Annotations[VariantAnnotation] != "compat" {
		t.Errorf("annotations %v", m.Annotations)
	}
	if got := pluginFromImage(t, img); !bytes.Equal(got, module) {
		t.Errorf("plugin.wasm differs from the module (%d bytes, want %d)", len(got), len(module))
	}
	files := layerFiles(t, img)
	if len(files) != 1 || files[PluginFile] == nil {
		t.Errorf("layer files %v, want only %s", files, PluginFile)
	}
	cf, _ := img.ConfigFile()
	if cf.OS != "" || cf.Architecture != "" || cf.Config.Labels["org.opencontainers.image.version"] != "9.9.9" {
		t.Errorf("config %+v", cf)
	}
	if _, err := WasmImage([]byte("#!/bin/sh"), "x.wasm", "1", Epoch); err == nil {
		t.Error("a non-Wasm file accepted")
	}
}

var (
	buildOnce sync.Once
	built     map[string]string
	buildErr  error
)

// buildInputs builds sluice.wasm and sluice-redis.wasm as `make wasm` does (wasmpatch
// included) and a static sluice for this machine's architecture, as `make images` does.
func buildInputs(t *testing.T) map[string]string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the modules and the binary")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-images-")
		if err != nil {
			buildErr = err
			return
		}
		built = map[string]string{
			"wasm":  filepath.Join(dir, "sluice.wasm"),
			"redis": filepath.Join(dir, "sluice-redis.wasm"),
			"serve": filepath.Join(dir, "linux-"+runtime.GOARCH, "sluice"),
		}
		root := repoRoot()
		for _, c := range []struct {
			env  []string
			args []string
		}{
			{[]string{"GOOS=wasip1", "GOARCH=wasm"}, []string{"build", "-buildmode=c-shared", "-trimpath", "-o", built["wasm"], "./cmd/sluice-wasm"}},
			{[]string{"GOOS=wasip1", "GOARCH=wasm"}, []string{"build", "-buildmode=c-shared", "-trimpath", "-tags", "redis", "-o", built["redis"], "./cmd/sluice-wasm"}},
			{nil, []string{"run", "./internal/wasmpatch/cmd/wasmpatch", built["wasm"], built["redis"]}},
			{[]string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + runtime.GOARCH}, []string{"build", "-trimpath", "-ldflags=-s -w", "-o", built["serve"], "./cmd/sluice"}},
		} {
			cmd := exec.Command("go", c.args...)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), c.env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = &buildError{strings.Join(c.args, " "), err, out}
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

type buildError struct {
	cmd string
	err error
	out []byte
}

func (e *buildError) Error() string {
	return "go " + e.cmd + ": " + e.err.Error() + "\n" + string(e.out)
}

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Join(wd, "..", "..")
}

// Build's output as the tools read it: each OCI layout and tarball through
// go-containerregistry's readers, the modules byte for byte, the serve image's entrypoint
// run.
func TestBuild(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("runs the Linux serve binary")
	}
	in := buildInputs(t)
	dir := t.TempDir()
	pl := "linux/" + runtime.GOARCH
	out, err := Build(Options{Dir: dir, Wasm: in["wasm"], RedisWasm: in["redis"], Serve: map[string]string{pl: in["serve"]}, Created: Epoch})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 {
		t.Fatalf("%d images", len(out))
	}
	for i, c := range []struct{ name, module string }{{NameWasm, in["wasm"]}, {NameRedisWasm, in["redis"]}} {
		t.Run(c.name, func(t *testing.T) {
			w := out[i]
			if want := Registry + "/" + c.name + ":" + Version; w.Ref.String() != want {
				t.Errorf("ref %s, want %s", w.Ref, want)
			}
			module, err := os.ReadFile(c.module)
			if err != nil {
				t.Fatal(err)
			}
			img := layoutImage(t, w.Layout, w.Digest)
			checkOCIImage(t, img)
			if got := pluginFromImage(t, img); !bytes.Equal(got, module) {
				t.Errorf("layout: plugin.wasm is not the built module")
			}
			if len(w.Tarball) != 1 {
				t.Fatalf("tarballs %v", w.Tarball)
			}
			timg := tarballImage(t, w.Tarball[0], w.Ref)
			sameImage(t, timg, img)
			if got := pluginFromImage(t, timg); !bytes.Equal(got, module) {
				t.Errorf("tarball: plugin.wasm is not the built module")
			}
		})
	}
	t.Run(NameServe, func(t *testing.T) {
		w := out[2]
		idx := layoutIndex(t, w.Layout, w.Digest)
		im, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if im.MediaType != types.OCIImageIndex || len(im.Manifests) != 1 {
			t.Fatalf("index %+v", im)
		}
		d := im.Manifests[0]
		if d.Platform == nil || d.Platform.String() != pl || d.MediaType != types.OCIManifestSchema1 {
			t.Errorf("index entry %+v, want %s", d, pl)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkOCIImage(t, img)
		cf, _ := img.ConfigFile()
		if !slices.Equal(cf.Config.Entrypoint, []string{"/sluice"}) || !slices.Equal(cf.Config.Cmd, []string{"serve"}) {
			t.Errorf("entrypoint %q cmd %q, want [/sluice] [serve]", cf.Config.Entrypoint, cf.Config.Cmd)
		}
		if cf.Config.User != ServeUser || strings.HasPrefix(cf.Config.User, "0") || cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
			t.Errorf("user %q, platform %s/%s", cf.Config.User, cf.OS, cf.Architecture)
		}
		files := layerFiles(t, img)
		if len(files) != 1 || files["sluice"] == nil || files["sluice"].Mode&0o111 == 0 {
			t.Fatalf("layer files %v, want the executable sluice alone", files)
		}
		bin := fileFromLayer(t, img, "sluice")
		want, _ := os.ReadFile(in["serve"])
		if !bytes.Equal(bin, want) {
			t.Error("/sluice is not the built binary")
		}
		// Static: nothing for a dynamic loader to do in an image without libc.
		ef, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ef.Progs {
			if p.Type == elf.PT_INTERP {
				t.Error("the serve binary asks for a dynamic loader")
			}
		}
		// The entrypoint and cmd, with the flags a Deployment's args would add: sluice serve.
		exe := filepath.Join(t.TempDir(), "sluice")
		if err := os.WriteFile(exe, bin, 0o755); err != nil {
			t.Fatal(err)
		}
		args := append(append([]string{}, cf.Config.Cmd...), "--help")
		cmd := exec.Command(exe, args...)
		outp, _ := cmd.CombinedOutput()
		if !strings.Contains(string(outp), "usage: sluice serve") {
			t.Errorf("%s %q printed:\n%s", cf.Config.Entrypoint, args, outp)
		}
		if len(w.Tarball) != 1 || !strings.HasSuffix(w.Tarball[0], "sluice-serve.linux-"+runtime.GOARCH+".tar") {
			t.Fatalf("tarballs %v", w.Tarball)
		}
		sameImage(t, tarballImage(t, w.Tarball[0], w.Ref), img)
	})

	// The same inputs give the same digests (fixed times in the tar and the config).
	again, err := Build(Options{Dir: t.TempDir(), Wasm: in["wasm"], RedisWasm: in["redis"], Serve: map[string]string{pl: in["serve"]}, Created: Epoch})
	if err != nil {
		t.Fatal(err)
	}
	for i := range out {
		if again[i].Digest != out[i].Digest {
			t.Errorf("%s: digest %s, then %s", out[i].Ref, out[i].Digest, again[i].Digest)
		}
	}
}

// sameImage checks that a tarball's image is the layout's: a docker tarball keeps the
// config (Docker's image ID is its digest) and the layers, not the manifest.
func sameImage(t *testing.T, tb, oci v1.Image) {
	t.Helper()
	c1, err1 := tb.ConfigName()
	c2, err2 := oci.ConfigName()
	if err1 != nil || err2 != nil || c1 != c2 {
		t.Errorf("tarball config %s (%v), layout config %s (%v)", c1, err1, c2, err2)
	}
	l1, err1 := tb.Layers()
	l2, err2 := oci.Layers()
	if err1 != nil || err2 != nil || len(l1) != 1 || len(l2) != 1 {
		t.Fatalf("layers %d (%v), %d (%v)", len(l1), err1, len(l2), err2)
	}
	d1, _ := l1[0].Digest()
	d2, _ := l2[0].Digest()
	if d1 != d2 {
		t.Errorf("tarball layer %s, layout layer %s", d1, d2)
	}
}

// layoutImage reads the OCI layout at dir: one entry, the image of digest d, tagged.
func layoutImage(t *testing.T, dir string, d v1.Hash) v1.Image {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	ii, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := ii.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != d || im.Manifests[0].Annotations[RefNameAnnotation] != Version {
		t.Fatalf("layout index %+v, want one entry %s tagged %s", im.Manifests, d, Version)
	}
	img, err := p.Image(d)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func layoutIndex(t *testing.T, dir string, d v1.Hash) v1.ImageIndex {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	ii, _ := p.ImageIndex()
	im, err := ii.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != d || im.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("layout index %+v, want one index %s", im.Manifests, d)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	inner, err := idx.ImageIndex(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(inner); err != nil {
		t.Errorf("validate index: %v", err)
	}
	return inner
}

// tarballImage reads a docker-loadable tarball: manifest.json names ref, and the image
// loads by that tag.
func tarballImage(t *testing.T, path string, ref name.Tag) v1.Image {
	t.Helper()
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{ref.String()}) {
		t.Fatalf("manifest.json %+v, want RepoTags [%s]", m, ref)
	}
	img, err := tarball.ImageFromPath(path, &ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Errorf("validate tarball image: %v", err)
	}
	return img
}
