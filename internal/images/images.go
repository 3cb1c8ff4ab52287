// Package images builds the OCI images that envoy/'s manifests reference, without Docker:
// the two Wasm modules as Istio and Higress fetch them, and a minimal image for `sluice
// serve`. It writes each as an OCI image layout (for crane push, skopeo copy) and as a
// docker-loadable tarball, with github.com/google/go-containerregistry doing the format.
//
// The Wasm images are the "compat" variant of the Wasm image specification: an OCI image
// manifest whose single layer (application/vnd.oci.image.layer.v1.tar+gzip) holds
// plugin.wasm. Istio's fetcher (istio/istio pkg/wasm/imagefetcher.go, unchanged in that
// respect from 1.16 to today) takes an OCI manifest's last layer of that media type and
// reads the file whose base name is plugin.wasm; a manifest of the other variant (a layer
// of application/vnd.module.wasm.content.layer.v1+wasm) is accepted only with exactly two
// layers. Higress runs the same fetcher (higress-group/istio pkg/wasm/imagefetcher.go; its
// 1.12 patch 20230319-imagefetcher-oci.patch is the same last-layer rule), and Higress's
// own plugins are built as `FROM scratch` + `COPY plugin.wasm`, which is this layout.
package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Version is the tag the images are built with by default and the one envoy/'s manifests
// name (envoy/manifests_test.go checks that they agree).
const Version = "0.1.0"

// Registry is where the manifests expect the images: Registry + "/" + image name.
const Registry = "ghcr.io/sluice-proxy"

// The images' names.
const (
	NameWasm      = "sluice"       // sluice.wasm: stock Envoy and Istio
	NameRedisWasm = "sluice-redis" // sluice-redis.wasm: Higress
	NameServe     = "sluice-serve" // the `sluice serve` rate-limit service
)

const (
	// PluginFile is the name Istio's fetcher looks for in the layer (by base name).
	PluginFile = "plugin.wasm"
	// VariantAnnotation marks a compat-variant Wasm image whose layer has the OCI media type
	// (the Wasm image specification asks for it; fetchers do not require it).
	VariantAnnotation = "module.wasm.image/variant"
	// ServeBinary is the path of the sluice binary in the serve image.
	ServeBinary = "/sluice"
	// ServeUser is the serve image's user: numeric, not root (runAsNonRoot accepts it).
	ServeUser = "65532:65532"
	// RefNameAnnotation is the OCI layout's tag annotation (skopeo's oci:DIR:TAG).
	RefNameAnnotation = "org.opencontainers.image.ref.name"
)

// ServeEntrypoint and ServeCmd make the image run `sluice serve` by default; a Kubernetes
// container's args (as in envoy/istio-ratelimit-service.yaml: serve --listen=…) replace
// ServeCmd and keep the entrypoint.
var (
	ServeEntrypoint = []string{ServeBinary}
	ServeCmd        = []string{"serve"}
)

// Epoch is the creation time written into the images unless SOURCE_DATE_EPOCH says
// otherwise: a fixed time, so that the same inputs give the same digests.
var Epoch = time.Unix(0, 0).UTC()

// CreatedFromEnv returns SOURCE_DATE_EPOCH as a time, or Epoch when unset.
func CreatedFromEnv() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return Epoch, nil
	}
	var sec int64
	if _, err := fmt.Sscan(s, &sec); err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %v", s, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// file is one regular file of a layer.
type file struct {
	name string
	mode int64
	data []byte
}

// layer builds an OCI gzip layer holding files (owned by root, stamped created).
func layer(files []file, created time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		hdr := &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     f.name,
			Mode:     f.mode,
			Size:     int64(len(f.data)),
			ModTime:  created,
			Format:   tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// image is an OCI image (OCI manifest and config media types) of one layer.
func image(cfg v1.ConfigFile, l v1.Layer, createdBy string, created time.Time, annotations map[string]string) (v1.Image, error) {
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	cfg.Created = v1.Time{Time: created}
	cfg.RootFS.Type = "layers" // the only type the image specification has
	base, err := mutate.ConfigFile(base, &cfg)
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     l,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: createdBy},
	})
	if err != nil {
		return nil, err
	}
	if len(annotations) > 0 {
		img = mutate.Annotations(img, annotations).(v1.Image)
	}
	return img, nil
}

func labels(title, description, version string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       title,
		"org.opencontainers.image.description": description,
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.source":      "https://github.com/sluice-proxy/sluice",
	}
}

// WasmImage is module as a compat-variant Wasm image: plugin.wasm in the single layer.
// The config names no OS or architecture: a Wasm module is neither a Linux program nor
// tied to a CPU, and `docker load` refuses an OS other than the host's but takes an empty
// one (moby image/tarexport, checkCompatibleOS). The fetchers read neither.
func WasmImage(module []byte, title, version string, created time.Time) (v1.Image, error) {
	if !bytes.HasPrefix(module, []byte("\x00asm")) {
		return nil, fmt.Errorf("%s: not a WebAssembly module", title)
	}
	l, err := layer([]file{{name: PluginFile, mode: 0o444, data: module}}, created)
	if err != nil {
		return nil, err
	}
	cfg := v1.ConfigFile{Config: v1.Config{Labels: labels(title, "sluice rate-limiting filter, Proxy-Wasm module ("+title+")", version)}}
	return image(cfg, l, "sluice-images: "+PluginFile+" = "+title, created, map[string]string{VariantAnnotation: "compat"})
}

// ServeImage is the `sluice serve` image for one platform: binary (a static Linux build of
// cmd/sluice) as /sluice, nothing else — no shell, no libc, no CA certificates (the
// service speaks only cleartext gRPC and Redis inside the cluster) — run as ServeUser.
func ServeImage(binary []byte, platform v1.Platform, version string, created time.Time) (v1.Image, error) {
	if !bytes.HasPrefix(binary, []byte("\x7fELF")) {
		return nil, fmt.Errorf("serve binary for %s is not an ELF executable", platform)
	}
	l, err := layer([]file{{name: strings.TrimPrefix(ServeBinary, "/"), mode: 0o555, data: binary}}, created)
	if err != nil {
		return nil, err
	}
	cfg := v1.ConfigFile{
		OS:           platform.OS,
		Architecture: platform.Architecture,
		Variant:      platform.Variant,
		Config: v1.Config{
			Entrypoint:   ServeEntrypoint,
			Cmd:          ServeCmd,
			User:         ServeUser,
			WorkingDir:   "/",
			ExposedPorts: map[string]struct{}{"8081/tcp": {}},
			Labels:       labels(NameServe, "sluice serve: Envoy's rate-limit service (RLS v3) on a Redis Cluster", version),
		},
	}
	return image(cfg, l, "sluice-images: "+ServeBinary, created, nil)
}

// Ref is the tagged reference of image name in registry.
func Ref(registry, imageName, tag string) (name.Tag, error) {
	return name.NewTag(registry+"/"+imageName+":"+tag, name.WeakValidation)
}

// Written says what Write wrote for one image.
type Written struct {
	Ref     name.Tag
	Layout  string   // the OCI layout directory
	Tarball []string // docker-loadable tarballs (one per platform for the serve image)
	Digest  v1.Hash  // of the manifest (or of the index for several platforms)
}

// layoutOptions annotate the layout's entry with its tag (skopeo's oci:DIR:TAG) and its full
// name (containerd's import).
func layoutOptions(ref name.Tag) []layout.Option {
	return []layout.Option{layout.WithAnnotations(map[string]string{
		RefNameAnnotation:          ref.TagStr(),
		"io.containerd.image.name": ref.String(),
	})}
}

// WriteImage writes img as the OCI layout dir/NAME and the tarball dir/NAME.tar.
func WriteImage(dir, imageName string, ref name.Tag, img v1.Image) (Written, error) {
	w := Written{Ref: ref, Layout: filepath.Join(dir, imageName)}
	if err := os.RemoveAll(w.Layout); err != nil {
		return w, err
	}
	p, err := layout.Write(w.Layout, empty.Index)
	if err != nil {
		return w, err
	}
	if err := p.AppendImage(img, layoutOptions(ref)...); err != nil {
		return w, err
	}
	if w.Digest, err = img.Digest(); err != nil {
		return w, err
	}
	tb := filepath.Join(dir, imageName+".tar")
	if err := tarball.WriteToFile(tb, ref, img); err != nil {
		return w, err
	}
	w.Tarball = []string{tb}
	return w, nil
}

// WriteIndex writes the images of several platforms as one OCI layout dir/NAME holding an
// image index, and one tarball per platform, dir/NAME.OS-ARCH[-VARIANT].tar (`docker load`
// takes one platform's image).
func WriteIndex(dir, imageName string, ref name.Tag, imgs map[string]v1.Image) (Written, error) {
	w := Written{Ref: ref, Layout: filepath.Join(dir, imageName)}
	keys := make([]string, 0, len(imgs))
	for k := range imgs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var adds []mutate.IndexAddendum
	for _, k := range keys {
		img := imgs[k]
		cf, err := img.ConfigFile()
		if err != nil {
			return w, err
		}
		pl := cf.Platform()
		if pl == nil {
			return w, fmt.Errorf("%s: image without a platform", k)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: pl}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	if err := os.RemoveAll(w.Layout); err != nil {
		return w, err
	}
	p, err := layout.Write(w.Layout, empty.Index)
	if err != nil {
		return w, err
	}
	if err := p.AppendIndex(idx, layoutOptions(ref)...); err != nil {
		return w, err
	}
	if w.Digest, err = idx.Digest(); err != nil {
		return w, err
	}
	for _, k := range keys {
		tb := filepath.Join(dir, imageName+"."+strings.ReplaceAll(k, "/", "-")+".tar")
		if err := tarball.WriteToFile(tb, ref, imgs[k]); err != nil {
			return w, err
		}
		w.Tarball = append(w.Tarball, tb)
	}
	return w, nil
}

// Options are the inputs of Build.
type Options struct {
	Dir       string            // output directory (dist/images)
	Registry  string            // default Registry
	Tag       string            // default Version
	Wasm      string            // sluice.wasm
	RedisWasm string            // sluice-redis.wasm
	Serve     map[string]string // platform ("linux/amd64") → static sluice binary
	Created   time.Time
}

// Build writes the three images of opts into opts.Dir and returns what it wrote, in the
// order sluice, sluice-redis, sluice-serve.
func Build(opts Options) ([]Written, error) {
	if opts.Registry == "" {
		opts.Registry = Registry
	}
	if opts.Tag == "" {
		opts.Tag = Version
	}
	if len(opts.Serve) == 0 {
		return nil, fmt.Errorf("no serve binary")
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	var out []Written
	for _, m := range []struct{ name, path string }{{NameWasm, opts.Wasm}, {NameRedisWasm, opts.RedisWasm}} {
		module, err := os.ReadFile(m.path)
		if err != nil {
			return nil, err
		}
		img, err := WasmImage(module, filepath.Base(m.path), opts.Tag, opts.Created)
		if err != nil {
			return nil, err
		}
		ref, err := Ref(opts.Registry, m.name, opts.Tag)
		if err != nil {
			return nil, err
		}
		w, err := WriteImage(opts.Dir, m.name, ref, img)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", m.name, err)
		}
		out = append(out, w)
	}
	ref, err := Ref(opts.Registry, NameServe, opts.Tag)
	if err != nil {
		return nil, err
	}
	imgs := map[string]v1.Image{}
	for pl, path := range opts.Serve {
		p, err := v1.ParsePlatform(pl)
		if err != nil {
			return nil, err
		}
		bin, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if imgs[pl], err = ServeImage(bin, *p, opts.Tag, opts.Created); err != nil {
			return nil, err
		}
	}
	w, err := WriteIndex(opts.Dir, NameServe, ref, imgs)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", NameServe, err)
	}
	return append(out, w), nil
}
