package main

import "testing"

func TestPkgOf(t *testing.T) {
	for name, want := range map[string]string{
		"github.com_sluice_proxy_sluice_filter.__Plugin_.onRequest": "github.com_sluice_proxy_sluice_filter",
		"github.com_sluice_proxy_sluice_filter.hashKey":             "github.com_sluice_proxy_sluice_filter",
		"runtime.__mheap_.alloc":                                    "runtime",
		"runtime.mapassign_faststr":                                 "runtime",
		"internal_strconv.formatBits":                               "internal_strconv",
		"go.uber.org_atomic.__Int64_.Load":                          "go.uber.org_atomic",
		"proxy_on_request_headers":                                  "proxy_on_request_headers",
		"":                                                          "(unnamed)",
	} {
		if got := pkgOf(name); got != want {
			t.Errorf("pkgOf(%q) = %q, want %q", name, got, want)
		}
	}
}

// A module of one imported function and two defined ones (bodies of 4 and 6 bytes with
// their size prefixes), named in the name section: the imported index shifts the names.
func TestParse(t *testing.T) {
	mod := []byte("\x00asm\x01\x00\x00\x00")
	section := func(id byte, body string) {
		mod = append(mod, id, byte(len(body)))
		mod = append(mod, body...)
	}
	section(1, "\x01\x60\x00\x00")                              // one type: () -> ()
	section(2, "\x01\x03env\x01f\x00\x00")                      // import env.f, a function of type 0
	section(3, "\x02\x00\x00")                                  // two functions of type 0
	section(10, "\x02\x03\x00\x01\x0b\x05\x00\x01\x01\x01\x0b") // bodies: 3+1 and 5+1 bytes
	names := "\x01\x0f\x02\x01\x05a.one\x02\x05b.two"           // function names 1 and 2
	section(0, "\x04name"+names)
	m, err := parse(mod)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.funcs) != 2 || m.funcs[0] != (function{"a.one", 4}) || m.funcs[1] != (function{"b.two", 6}) {
		t.Fatalf("parsed %+v", m.funcs)
	}
	if _, err := parse(mod[:len(mod)-3]); err == nil {
		t.Fatal("a truncated module parsed")
	}
}
