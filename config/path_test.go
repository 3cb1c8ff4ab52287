package config

import (
	"strings"
	"testing"
)

// The expectations of Envoy's own tests of PathUtil::canonicalPath and
// PathUtil::mergeSlashes (test/common/http/path_utility_test.cc, Envoy main
// with the CVE-2026-73551 fix: NormalizeValidPaths, NormalizeCasePath,
// MergeSlashes), composed as the connection manager applies them
// (normalize_path, then merge_slashes) and cut at the query, which neither
// touches. Envoy's MergeSlashes cases on relative paths ("a//b/c") get the
// leading '/' canonicalization adds first.
var envoyPathCases = []struct{ in, want string }{
	// AlreadyNormalPaths
	{"/xyz", "/xyz"},
	{"/x/y/z", "/x/y/z"},
	// NormalizeValidPaths
	{"/a/b/../c", "/a/c"},
	{"/a/b/./c", "/a/b/c"},
	{"a/b/../c", "/a/c"},
	{"/a/b/../../../../c", "/c"},
	{"/a/..\\c", "/c"},
	{"/%c0%af", "/%c0%af"},
	{"/%5c%25", "/%5c%25"},
	{"/a/b/%2E%2E/c", "/a/c"},
	{"/xyz/..;foo=bar/abc", "/abc"},
	{"/..;foo=bar/abc", "/abc"},
	{"/xyz/..;foo=bar", "/"},
	{"/xyz/.;foo=bar/abc", "/xyz/abc"},
	{"/.;foo=bar/abc", "/abc"},
	{"/xyz/.;foo=bar", "/xyz/"},
	{"/xyz/..;foo=bar/.;v1=2,v2=3/abc", "/abc"},
	{"/..;foo=bar/abc/.;mmm", "/abc/"},
	{"/.;aaa/..;foo=bar/abc/.;mmm", "/abc/"},
	{"/xyz/..;foo=bar/.;fff=zzz", "/"},
	{"/xyz/..;foo=bar/.;fff=zzz?blah=woops", "/"},
	{"/xyz/..;foo=bar/.;fff=zzz/remain;blah-bluh?query", "/remain;blah-bluh"},
	// StripDotSegmentWithParameters, then canonicalized
	{"/a/..;foo/b/..;bar/c", "/c"},
	{"/a/..;param1;param2/b", "/b"},
	{"/xyz/..foo", "/xyz/..foo"},
	{"/xyz/...;foo", "/xyz/...;foo"},
	{"/xyz?param=/..;foo", "/xyz"},
	// NormalizeCasePath
	{"/A/B/C", "/A/B/C"},
	{"/a/b/%2e%2e/c", "/a/c"},
	{"/a/%2F%2f/c", "/a/%2F%2f/c"},
	// MergeSlashes
	{"a//b/c", "/a/b/c"},
	{"/a//b/c/", "/a/b/c/"},
	{"a//b/c/", "/a/b/c/"},
	{"/a", "/a"},
	{"//a/b/c", "/a/b/c"},
	{"/a/b/c//", "/a/b/c/"},
	{"/a///b/c", "/a/b/c"},
	{"/a////b/c", "/a/b/c"},
	{"/a//b?a=///c", "/a/b"},
	{"/a//b?", "/a/b"},
	{"//a/?b", "/a/"},
}

// Our own cases: the bypasses, and what the Chromium canonicalizer
// Envoy links (googleurl dd4080fec) does with escapes.
var ownPathCases = []struct{ in, want string }{
	// The path-normalisation bypasses: every one is /h.
	{"/%68", "/h"},
	{"//h", "/h"},
	{"/./h", "/h"},
	{"/x/../h", "/h"},
	{"/h/../h", "/h"},
	{"/%2568/../h", "/h"},
	{"/%2e/h", "/h"},
	{"/%2E%2e/h", "/h"},
	{"\\h", "/h"},
	{"/x/..\\h", "/h"},
	{"/..;/h", "/h"},
	{"h", "/h"},
	{"/h#frag", "/h"},
	{"/h?q=/../x", "/h"},
	// One pass: %25 is kept, so %2568 is the text %68, never h.
	{"/%2568", "/%2568"},
	{"/%252e%252e/h", "/%252e%252e/h"},
	// Unreserved escapes decoded (either hex case), others kept as written.
	{"/%41%7a%30%2D%5f%7E", "/Az0-_~"},
	{"/%2f%2F%5c%5C%3f%23%25%20%3B", "/%2f%2F%5c%5C%3f%23%25%20%3B"},
	{"/a%2Eb", "/a.b"},
	{"/foo/%2e", "/foo/"},
	{"/foo/%2e%2", "/foo/.%2"},
	{"/foo/%2e./%2e%2e/.%2e/%2e.bar", "/..bar"},
	// Invalid escapes kept literally; a nested one cannot turn into an escape.
	{"/%zz/%", "/%zz/%"},
	{"/foo%2%zzbar", "/foo%2%zzbar"},
	{"/%%30%30", "/%2500"},
	{"/%%41", "/%A"},
	{"/%%36%31", "/%2561"},
	// Bytes not allowed in a path escaped with upper-case hex; NUL too
	// (Envoy refuses those requests; we still match them).
	{"/a b\"<>`{|}^", "/a%20b%22%3C%3E%60%7B%7C%7D%5E"},
	{"/caf\xc3\xa9", "/caf%C3%A9"},
	{"/\x00\x7f", "/%00%7F"},
	{"/xyz/.%00../abc", "/xyz/.%00../abc"},
	// Allowed as is.
	{"/!$&'()*+,;=:@[]", "/!$&'()*+,;=:@[]"},
	{"/.well-known/x", "/.well-known/x"},
	{"/...", "/..."},
	{"/a/..b/.c", "/a/..b/.c"},
	// Dots resolve before slashes merge (Envoy's order): the empty segment
	// is the one ".." removes.
	{"/a//../b", "/a/b"},
	{"/a/..//b", "/b"},
	// Edges.
	{"", "/"},
	{"/", "/"},
	{"//", "//"}, // Envoy's mergeSlashes leaves "//" as is
	{"///", "//"},
	{"/..", "/"},
	{"/../..", "/"},
	{"*", "/*"},
	// One pass leaves "/h/..;/x" (Envoy strips ".;" parameters on '/'-segments
	// before '\\' becomes '/'); the settled form resolves it.
	{"/h\\..;/x", "/x"},
	{"\\.;", "/"},
}

func TestNormalizePathEnvoyCases(t *testing.T) {
	for _, tc := range envoyPathCases {
		if got := NormalizePath(tc.in); got != tc.want {
			t.Errorf("NormalizePath(%q) = %q, want %q (Envoy)", tc.in, got, tc.want)
		}
	}
}

func TestNormalizePathOwnCases(t *testing.T) {
	for _, tc := range ownPathCases {
		if got := NormalizePath(tc.in); got != tc.want {
			t.Errorf("NormalizePath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// referenceNormal is a slow, obviously-written model of the normalization
// for paths without '%' and bytes that need escaping: referenceOnce until
// nothing changes.
func referenceNormal(p string) string {
	for {
		q := referenceOnce(p)
		if q == p {
			return q
		}
		p = q
	}
}

// referenceOnce is one pass: strip parameters of dot segments, treat '\' as
// '/', resolve "." and ".." segment by segment (".." removes the segment
// before it, empty ones included, never the root), then merge slashes as
// Envoy's mergeSlashes does.
func referenceOnce(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		switch {
		case strings.HasPrefix(s, "..;"):
			segs[i] = ".."
		case strings.HasPrefix(s, ".;"):
			segs[i] = "."
		}
	}
	p = strings.Join(segs, "/")
	if p == "" || (p[0] != '/' && p[0] != '\\') {
		p = "/" + p
	}
	p = strings.ReplaceAll(p, "\\", "/")
	in := strings.Split(p[1:], "/")
	out := "/"
	for i, s := range in {
		last := i == len(in)-1
		switch s {
		case ".":
		case "..":
			if len(out) > 1 {
				out = out[:strings.LastIndexByte(out[:len(out)-1], '/')+1]
			}
		default:
			out += s
			if !last {
				out += "/"
			}
		}
	}
	if !strings.Contains(out, "//") {
		return out
	}
	var kept []string
	for _, s := range strings.Split(out, "/") {
		if s != "" {
			kept = append(kept, s)
		}
	}
	r := "/" + strings.Join(kept, "/")
	if strings.HasSuffix(out, "/") {
		r += "/"
	}
	return r
}

// TestNormalizePathAgainstReference compares every path of up to 7
// characters from {/ \ . a ;} with the reference, and checks that
// PathIsNormal never claims a path is normal when it is not.
func TestNormalizePathAgainstReference(t *testing.T) {
	const alphabet = "/\\.a;"
	var buf []byte
	n, normal := 0, 0
	var walk func(p []byte)
	walk = func(p []byte) {
		s := string(p)
		want := referenceNormal(s)
		buf = AppendNormalPath(buf[:0], s)
		if string(buf) != want {
			t.Fatalf("AppendNormalPath(%q) = %q, reference %q", s, buf, want)
		}
		if PathIsNormal(s) {
			normal++
			if want != s {
				t.Fatalf("PathIsNormal(%q) = true, but it normalizes to %q", s, want)
			}
		}
		n++
		if len(p) == 7 {
			return
		}
		for i := 0; i < len(alphabet); i++ {
			walk(append(p, alphabet[i]))
		}
	}
	walk(nil)
	t.Logf("%d paths, %d recognised as normal by the fast test", n, normal)
	if normal < 1000 {
		t.Errorf("PathIsNormal recognised only %d paths", normal)
	}
}

func TestPathIsNormal(t *testing.T) {
	for _, p := range []string{"/", "/h", "/api/v1/users", "/index.html", "/.well-known/acme", "/v1.2/x", "/a/...", "/a/..b", "/a.;b", "/~user/a-b_c", "/a;b=c/d"} {
		if !PathIsNormal(p) {
			t.Errorf("PathIsNormal(%q) = false", p)
		}
		if got := NormalizePath(p); got != p {
			t.Errorf("NormalizePath(%q) = %q", p, got)
		}
	}
	for _, p := range []string{"", "h", "//h", "/./h", "/a/..", "/a/.", "/a/.;x", "/a/..;x", "/%68", "/a\\b", "/a b", "/\xc3\xa9", "/a/.%2e/b"} {
		if PathIsNormal(p) {
			t.Errorf("PathIsNormal(%q) = true", p)
		}
	}
}

// TestNormalizePathIdempotent: a path Envoy has already normalized (the filter
// then sees it) normalizes to itself, so the filter compares exactly what
// Envoy forwards.
func TestNormalizePathIdempotent(t *testing.T) {
	for _, tc := range append(append([]struct{ in, want string }{}, envoyPathCases...), ownPathCases...) {
		once := NormalizePath(tc.in)
		if twice := NormalizePath(once); twice != once {
			t.Errorf("NormalizePath(%q) = %q, but NormalizePath(%q) = %q", tc.in, once, once, twice)
		}
	}
}

func TestAppendNormalPathKeepsPrefix(t *testing.T) {
	got := AppendNormalPath([]byte("key:"), "/x/../%68?q")
	if string(got) != "key:/h" {
		t.Fatalf("got %q", got)
	}
	got = AppendNormalPath([]byte("key:"), "/a/..;p/b")
	if string(got) != "key:/b" {
		t.Fatalf("got %q", got)
	}
}

func TestNormalizePathAllocations(t *testing.T) {
	buf := make([]byte, 0, 256)
	paths := []string{"/api/v1/users", "/x/../%68", "//h//i/", "/a/..;p/b/%%30%30", "/caf\xc3\xa9"}
	allocs := testing.AllocsPerRun(100, func() {
		for _, p := range paths {
			if !PathIsNormal(p) {
				buf = AppendNormalPath(buf[:0], p)
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per run, want 0", allocs)
	}
}

func FuzzNormalizePath(f *testing.F) {
	for _, tc := range envoyPathCases {
		f.Add(tc.in)
	}
	for _, tc := range ownPathCases {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, p string) {
		out := NormalizePath(p)
		if out == "" || out[0] != '/' {
			t.Fatalf("NormalizePath(%q) = %q: not a path", p, out)
		}
		if strings.ContainsAny(out, "?#\\ \x00") {
			t.Fatalf("NormalizePath(%q) = %q: contains a byte a normal path never has", p, out)
		}
		for i := 0; i < len(out); i++ {
			if out[i] < 0x21 || out[i] > 0x7e {
				t.Fatalf("NormalizePath(%q) = %q: byte %#x", p, out, out[i])
			}
		}
		if again := NormalizePath(out); again != out {
			t.Fatalf("not idempotent: %q -> %q -> %q", p, out, again)
		}
		if PathIsNormal(PathPart(p)) && out != PathPart(p) {
			t.Fatalf("PathIsNormal(%q) but it normalizes to %q", p, out)
		}
	})
}
