// Command wasm-size splits the code section of Proxy-Wasm modules by package: the bytes of
// each function body (from the code section) summed by the package its name (from the
// name section) belongs to. V8 compiles the code section while Envoy creates the VMs, so
// the code section's size is what Envoy's time to /ready follows (make bench-envoy, phase
// startup); this says where those bytes come from.
//
//	go run ./bench/cmd/wasm-size [-top 25] MODULE.wasm [MODULE.wasm ...]
//
// With no module it builds and compares sluice.wasm and the no-op standard-Go module
// (host/testdata/guests/minimal), the pair behind bench-envoy's start-up ratio.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	top := flag.Int("top", 25, "packages to list per module")
	flag.Parse()
	mods := flag.Args()
	if len(mods) == 0 {
		dir, err := os.MkdirTemp("", "wasm-size")
		if err != nil {
			fail(err)
		}
		defer os.RemoveAll(dir)
		for _, b := range [][2]string{{"sluice.wasm", "./cmd/sluice-wasm"}, {"noop.wasm", "./host/testdata/guests/minimal"}} {
			out := filepath.Join(dir, b[0])
			cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, b[1])
			cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				fail(fmt.Errorf("building %s: %w", b[1], err))
			}
			mods = append(mods, out)
		}
	}
	var first int
	for i, path := range mods {
		data, err := os.ReadFile(path)
		if err != nil {
			fail(err)
		}
		m, err := parse(data)
		if err != nil {
			fail(fmt.Errorf("%s: %w", path, err))
		}
		total := 0
		for _, f := range m.funcs {
			total += f.size
		}
		if i == 0 {
			first = total
		}
		fmt.Printf("%s: file %d bytes, code %d bytes in %d functions", filepath.Base(path), len(data), total, len(m.funcs))
		if i > 0 && total > 0 {
			fmt.Printf(" (%s: %.2f× this)", filepath.Base(mods[0]), float64(first)/float64(total))
		}
		fmt.Println()
		byPkg := map[string]int{}
		for _, f := range m.funcs {
			byPkg[pkgOf(f.name)] += f.size
		}
		type row struct {
			pkg  string
			size int
		}
		var rows []row
		for p, s := range byPkg {
			rows = append(rows, row{p, s})
		}
		sort.Slice(rows, func(i, j int) bool {
			return rows[i].size > rows[j].size || rows[i].size == rows[j].size && rows[i].pkg < rows[j].pkg
		})
		for k, r := range rows {
			if k == *top {
				rest := 0
				for _, r := range rows[k:] {
					rest += r.size
				}
				fmt.Printf("  %9d %5.1f%%  (%d more packages)\n", rest, 100*float64(rest)/float64(total), len(rows)-k)
				break
			}
			fmt.Printf("  %9d %5.1f%%  %s\n", r.size, 100*float64(r.size)/float64(total), r.pkg)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "wasm-size:", err)
	os.Exit(1)
}

// pkgOf is the package of a function as Go's linker names it in the name section, the
// path's slashes turned into underscores ("github.com_sluice_proxy_sluice_filter.__Plugin_.onRequest",
// "internal_strconv.formatBits"): the part before the first dot, or, after a domain
// ("github.com_…"), before the first dot past it.
func pkgOf(name string) string {
	if name == "" {
		return "(unnamed)"
	}
	from := 0
	if u := strings.IndexByte(name, '_'); u > 0 {
		if d := strings.LastIndexByte(name[:u], '.'); d >= 0 && isTLD(name[d+1:u]) {
			from = u // a module path's domain: "github.com_"
		}
	}
	if d := strings.IndexByte(name[from:], '.'); d >= 0 {
		return name[:from+d]
	}
	return name
}

// isTLD reports whether s ends a module path's domain, as the modules a guest can import
// name theirs.
func isTLD(s string) bool {
	switch s {
	case "com", "org", "io", "net", "dev", "in", "co":
		return true
	}
	return false
}

type function struct {
	name string
	size int // the body's bytes, with its size prefix
}

type module struct{ funcs []function }

var errShort = errors.New("truncated module")

type reader struct{ b []byte }

func (r *reader) uleb() (uint64, error) {
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if len(r.b) == 0 {
			return 0, errShort
		}
		c := r.b[0]
		r.b = r.b[1:]
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, nil
		}
	}
	return 0, errors.New("bad LEB128")
}

func (r *reader) bytes(n uint64) ([]byte, error) {
	if uint64(len(r.b)) < n {
		return nil, errShort
	}
	b := r.b[:n]
	r.b = r.b[n:]
	return b, nil
}

func (r *reader) name() (string, error) {
	n, err := r.uleb()
	if err != nil {
		return "", err
	}
	b, err := r.bytes(n)
	return string(b), err
}

// parse reads the imports (function imports shift the function index space), the code
// section's body sizes and the name section's function names.
func parse(data []byte) (*module, error) {
	if len(data) < 8 || string(data[:4]) != "\x00asm" {
		return nil, errors.New("not a wasm module")
	}
	r := &reader{data[8:]}
	imported := 0
	var sizes []int
	names := map[uint64]string{}
	for len(r.b) > 0 {
		id := r.b[0]
		r.b = r.b[1:]
		n, err := r.uleb()
		if err != nil {
			return nil, err
		}
		body, err := r.bytes(n)
		if err != nil {
			return nil, err
		}
		s := &reader{body}
		switch id {
		case 2: // imports
			if imported, err = countFuncImports(s); err != nil {
				return nil, err
			}
		case 10: // code
			cnt, err := s.uleb()
			if err != nil {
				return nil, err
			}
			for i := uint64(0); i < cnt; i++ {
				before := len(s.b)
				l, err := s.uleb()
				if err != nil {
					return nil, err
				}
				if _, err := s.bytes(l); err != nil {
					return nil, err
				}
				sizes = append(sizes, before-len(s.b))
			}
		case 0: // custom
			nm, err := s.name()
			if err != nil {
				return nil, err
			}
			if nm == "name" {
				if err := readNames(s, names); err != nil {
					return nil, err
				}
			}
		}
	}
	m := &module{}
	for i, sz := range sizes {
		m.funcs = append(m.funcs, function{names[uint64(imported+i)], sz})
	}
	return m, nil
}

func countFuncImports(s *reader) (int, error) {
	cnt, err := s.uleb()
	if err != nil {
		return 0, err
	}
	funcs := 0
	for i := uint64(0); i < cnt; i++ {
		if _, err := s.name(); err != nil {
			return 0, err
		}
		if _, err := s.name(); err != nil {
			return 0, err
		}
		kind, err := s.bytes(1)
		if err != nil {
			return 0, err
		}
		switch kind[0] {
		case 0: // function: type index
			funcs++
			_, err = s.uleb()
		case 1: // table: reftype, limits
			if _, err = s.bytes(1); err == nil {
				err = skipLimits(s)
			}
		case 2: // memory: limits
			err = skipLimits(s)
		case 3: // global: valtype, mutability
			_, err = s.bytes(2)
		default:
			err = fmt.Errorf("import kind %d", kind[0])
		}
		if err != nil {
			return 0, err
		}
	}
	return funcs, nil
}

func skipLimits(s *reader) error {
	flag, err := s.bytes(1)
	if err != nil {
		return err
	}
	if _, err := s.uleb(); err != nil {
		return err
	}
	if flag[0]&1 == 1 {
		_, err = s.uleb()
	}
	return err
}

func readNames(s *reader, names map[uint64]string) error {
	for len(s.b) > 0 {
		sub, err := s.bytes(1)
		if err != nil {
			return err
		}
		n, err := s.uleb()
		if err != nil {
			return err
		}
		b, err := s.bytes(n)
		if err != nil {
			return err
		}
		if sub[0] != 1 { // function names
			continue
		}
		f := &reader{b}
		cnt, err := f.uleb()
		if err != nil {
			return err
		}
		for i := uint64(0); i < cnt; i++ {
			idx, err := f.uleb()
			if err != nil {
				return err
			}
			nm, err := f.name()
			if err != nil {
				return err
			}
			names[idx] = nm
		}
	}
	return nil
}
