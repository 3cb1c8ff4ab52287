// Package wasmpatch gives a standard-Go wasip1 module its own poll_oneoff.
//
// Go's runtime calls WASI poll_oneoff when it restarts the world after a garbage
// collection (netpoll, once a runtime timer has ever been armed) and when it sleeps
// (usleep). proxy-wasm-cpp-host before PR #533 — every Envoy from 1.33 to 1.38, Istio
// 1.25 to 1.30 — answers poll_oneoff with ENOSYS, on which the runtime throws, and traps the
// call outright while proxy_on_memory_allocate runs. A Proxy-Wasm module never has anything
// to poll: it owns no file descriptor, and a filter never sleeps. So the module answers
// itself, the way cpp-host answers from #533 on: no events, success, no wait.
//
// PollOneoff rewrites the one call to the imported function — inside the runtime's
// wasmimport wrapper, runtime.poll_oneoff, found through the name section — into a call to
// a function appended to the module: store 0 at *nevents, return 0. The import itself stays
// (every cpp-host provides it, so linking is unchanged), but nothing calls it any more. No
// function index moves: the new function is the last one. The patch refuses (with an
// error) any module that does not look exactly as expected, rather than guess.
package wasmpatch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
)

// ShimName is the name the appended function is given in the name section.
const ShimName = "sluice.poll_oneoff_noevents"

const (
	secCustom   = 0
	secType     = 1
	secImport   = 2
	secFunction = 3
	secCode     = 10
	opCall      = 0x10
)

type section struct {
	id   byte
	body []byte
}

// PollOneoff returns a copy of mod in which the Go runtime's calls to WASI poll_oneoff go
// to a function of the module instead (see the package comment). A module already
// patched is returned unchanged.
func PollOneoff(mod []byte) ([]byte, error) {
	if len(mod) < 8 || !bytes.Equal(mod[:4], []byte("\x00asm")) || binary.LittleEndian.Uint32(mod[4:8]) != 1 {
		return nil, errors.New("wasmpatch: not a WebAssembly 1.0 binary module")
	}
	secs, err := splitSections(mod[8:])
	if err != nil {
		return nil, err
	}
	find := func(id byte) *section {
		for i := range secs {
			if secs[i].id == id {
				return &secs[i]
			}
		}
		return nil
	}
	var names *section
	for i := range secs {
		if secs[i].id == secCustom {
			if n, rest, err := readName(secs[i].body); err == nil && n == "name" {
				_ = rest
				names = &secs[i]
			}
		}
	}
	typ, imp, fn, code := find(secType), find(secImport), find(secFunction), find(secCode)
	if typ == nil || imp == nil || fn == nil || code == nil || names == nil {
		return nil, errors.New("wasmpatch: module lacks a type, import, function, code or name section")
	}
	pollIdx, pollType, nImports, err := findImport(imp.body)
	if err != nil {
		return nil, err
	}
	if err := checkPollType(typ.body, pollType); err != nil {
		return nil, err
	}
	nDefined, err := vecLen(fn.body)
	if err != nil {
		return nil, fmt.Errorf("wasmpatch: function section: %w", err)
	}
	fnNames, err := functionNames(names.body)
	if err != nil {
		return nil, err
	}
	for idx, n := range fnNames {
		if n == ShimName && idx == nImports+nDefined-1 {
			return append([]byte(nil), mod...), nil // already patched
		}
	}
	wrapper := -1
	for idx, n := range fnNames {
		if n == "runtime.poll_oneoff" {
			wrapper = int(idx)
		}
	}
	if wrapper < int(nImports) {
		return nil, errors.New("wasmpatch: no function runtime.poll_oneoff in the name section (not a Go wasip1 module?)")
	}
	shimIdx := nImports + nDefined

	// function section: one more entry, of poll_oneoff's type
	fn.body = appendVecEntry(fn.body, uleb(nil, uint64(pollType)))

	// code section: redirect the wrapper's call, append the shim's body
	bodies, err := splitCode(code.body)
	if err != nil {
		return nil, err
	}
	w := wrapper - int(nImports)
	if w >= len(bodies) {
		return nil, errors.New("wasmpatch: runtime.poll_oneoff has no body")
	}
	nb, err := redirectCall(bodies[w], pollIdx, shimIdx)
	if err != nil {
		return nil, err
	}
	bodies[w] = nb
	// (i32 in, i32 out, i32 nsubscriptions, i32 nevents) -> i32:
	//   i32.store (local.get 3) (i32.const 0) ; return 0
	shim := []byte{0x00, 0x20, 0x03, 0x41, 0x00, 0x36, 0x02, 0x00, 0x41, 0x00, 0x0b}
	bodies = append(bodies, shim)
	code.body = joinCode(bodies)

	// name section: name the shim (entries stay sorted: it has the largest index)
	names.body, err = addFunctionName(names.body, shimIdx, ShimName)
	if err != nil {
		return nil, err
	}

	out := append([]byte(nil), mod[:8]...)
	for _, s := range secs {
		out = append(out, s.id)
		out = uleb(out, uint64(len(s.body)))
		out = append(out, s.body...)
	}
	return out, nil
}

func splitSections(b []byte) ([]section, error) {
	var secs []section
	for len(b) > 0 {
		id := b[0]
		n, k, err := readULEB(b[1:])
		if err != nil || uint64(len(b)-1-k) < n {
			return nil, errors.New("wasmpatch: truncated section")
		}
		start := 1 + k
		secs = append(secs, section{id: id, body: append([]byte(nil), b[start:start+int(n)]...)})
		b = b[start+int(n):]
	}
	return secs, nil
}

func readULEB(b []byte) (uint64, int, error) {
	var v uint64
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i]&0x80 == 0 {
			return v, i + 1, nil
		}
	}
	return 0, 0, errors.New("wasmpatch: bad LEB128")
}

func uleb(dst []byte, v uint64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			dst = append(dst, c|0x80)
			continue
		}
		return append(dst, c)
	}
}

func readName(b []byte) (string, []byte, error) {
	n, k, err := readULEB(b)
	if err != nil || uint64(len(b)-k) < n {
		return "", nil, errors.New("wasmpatch: bad name")
	}
	return string(b[k : k+int(n)]), b[k+int(n):], nil
}

func vecLen(b []byte) (uint32, error) {
	n, _, err := readULEB(b)
	return uint32(n), err
}

// appendVecEntry increments a vector's count and appends entry.
func appendVecEntry(b, entry []byte) []byte {
	n, k, _ := readULEB(b)
	out := uleb(nil, n+1)
	out = append(out, b[k:]...)
	return append(out, entry...)
}

// funcImport is one imported function; its index is its position among them.
type funcImport struct {
	module, name string
	typ          uint32
}

// funcImports lists the functions an import section imports, in index order.
func funcImports(b []byte) ([]funcImport, error) {
	n, k, err := readULEB(b)
	if err != nil {
		return nil, err
	}
	b = b[k:]
	var fns []funcImport
	for i := uint64(0); i < n; i++ {
		var mod, name string
		if mod, b, err = readName(b); err != nil {
			return nil, err
		}
		if name, b, err = readName(b); err != nil {
			return nil, err
		}
		if len(b) == 0 {
			return nil, errors.New("wasmpatch: truncated import")
		}
		kind := b[0]
		b = b[1:]
		switch kind {
		case 0x00: // function
			t, k, err := readULEB(b)
			if err != nil {
				return nil, err
			}
			b = b[k:]
			fns = append(fns, funcImport{mod, name, uint32(t)})
		case 0x01: // table: reftype, limits
			if len(b) < 1 {
				return nil, errors.New("wasmpatch: truncated table import")
			}
			if b, err = skipLimits(b[1:]); err != nil {
				return nil, err
			}
		case 0x02: // memory: limits
			if b, err = skipLimits(b); err != nil {
				return nil, err
			}
		case 0x03: // global: valtype, mut
			if len(b) < 2 {
				return nil, errors.New("wasmpatch: truncated global import")
			}
			b = b[2:]
		default:
			return nil, fmt.Errorf("wasmpatch: unknown import kind %#x", kind)
		}
	}
	return fns, nil
}

// findImport returns the function index and type of wasi_snapshot_preview1.poll_oneoff and
// the number of imported functions.
func findImport(b []byte) (idx, typ, nFuncs uint32, err error) {
	fns, err := funcImports(b)
	if err != nil {
		return 0, 0, 0, err
	}
	found := false
	for i, f := range fns {
		if (f.module == "wasi_snapshot_preview1" || f.module == "wasi_unstable") && f.name == "poll_oneoff" {
			if found {
				return 0, 0, 0, errors.New("wasmpatch: poll_oneoff imported twice")
			}
			idx, typ, found = uint32(i), f.typ, true
		}
	}
	if !found {
		return 0, 0, 0, errors.New("wasmpatch: the module does not import poll_oneoff")
	}
	return idx, typ, uint32(len(fns)), nil
}

func skipLimits(b []byte) ([]byte, error) {
	if len(b) == 0 {
		return nil, errors.New("wasmpatch: truncated limits")
	}
	flags := b[0]
	b = b[1:]
	nums := 1
	if flags&1 != 0 {
		nums = 2
	}
	for i := 0; i < nums; i++ {
		_, k, err := readULEB(b)
		if err != nil {
			return nil, err
		}
		b = b[k:]
	}
	return b, nil
}

// checkPollType insists on poll_oneoff's signature: (i32, i32, i32, i32) -> i32.
func checkPollType(b []byte, t uint32) error {
	n, k, err := readULEB(b)
	if err != nil || uint64(t) >= n {
		return errors.New("wasmpatch: bad type section")
	}
	b = b[k:]
	for i := uint32(0); ; i++ {
		if len(b) == 0 || b[0] != 0x60 {
			return errors.New("wasmpatch: bad function type")
		}
		b = b[1:]
		np, k, _ := readULEB(b)
		params := b[k : k+int(np)]
		b = b[k+int(np):]
		nr, k, _ := readULEB(b)
		results := b[k : k+int(nr)]
		b = b[k+int(nr):]
		if i == t {
			if !bytes.Equal(params, []byte{0x7f, 0x7f, 0x7f, 0x7f}) || !bytes.Equal(results, []byte{0x7f}) {
				return errors.New("wasmpatch: poll_oneoff is not (i32,i32,i32,i32)->i32")
			}
			return nil
		}
	}
}

func functionNames(b []byte) (map[uint32]string, error) {
	if _, rest, err := readName(b); err == nil {
		b = rest
	}
	for len(b) > 0 {
		id := b[0]
		n, k, err := readULEB(b[1:])
		if err != nil || uint64(len(b)-1-k) < n {
			return nil, errors.New("wasmpatch: bad name subsection")
		}
		sub := b[1+k : 1+k+int(n)]
		b = b[1+k+int(n):]
		if id != 1 {
			continue
		}
		cnt, k, err := readULEB(sub)
		if err != nil {
			return nil, err
		}
		sub = sub[k:]
		names := make(map[uint32]string, cnt)
		for i := uint64(0); i < cnt; i++ {
			idx, k, err := readULEB(sub)
			if err != nil {
				return nil, err
			}
			var name string
			if name, sub, err = readName(sub[k:]); err != nil {
				return nil, err
			}
			names[uint32(idx)] = name
		}
		return names, nil
	}
	return nil, errors.New("wasmpatch: the name section has no function names")
}

func addFunctionName(b []byte, idx uint32, name string) ([]byte, error) {
	head, rest, err := readName(b)
	if err != nil {
		return nil, err
	}
	out := uleb(nil, uint64(len(head)))
	out = append(out, head...)
	b = rest
	for len(b) > 0 {
		id := b[0]
		n, k, err := readULEB(b[1:])
		if err != nil {
			return nil, err
		}
		sub := b[1+k : 1+k+int(n)]
		b = b[1+k+int(n):]
		if id == 1 {
			entry := uleb(nil, uint64(idx))
			entry = uleb(entry, uint64(len(name)))
			entry = append(entry, name...)
			sub = appendVecEntry(sub, entry)
		}
		out = append(out, id)
		out = uleb(out, uint64(len(sub)))
		out = append(out, sub...)
	}
	return out, nil
}

func splitCode(b []byte) ([][]byte, error) {
	n, k, err := readULEB(b)
	if err != nil {
		return nil, err
	}
	b = b[k:]
	bodies := make([][]byte, 0, n+1)
	for i := uint64(0); i < n; i++ {
		size, k, err := readULEB(b)
		if err != nil || uint64(len(b)-k) < size {
			return nil, errors.New("wasmpatch: truncated code entry")
		}
		bodies = append(bodies, b[k:k+int(size)])
		b = b[k+int(size):]
	}
	return bodies, nil
}

func joinCode(bodies [][]byte) []byte {
	out := uleb(nil, uint64(len(bodies)))
	for _, body := range bodies {
		out = uleb(out, uint64(len(body)))
		out = append(out, body...)
	}
	return out
}

// redirectCall replaces the single `call from` in a wrapper's body by `call to`. The
// wrapper is the small function Go generates for a wasmimport; it must contain the byte
// pattern exactly once, or the patch refuses.
func redirectCall(body []byte, from, to uint32) ([]byte, error) {
	pat := uleb([]byte{opCall}, uint64(from))
	if c := bytes.Count(body, pat); c != 1 {
		return nil, fmt.Errorf("wasmpatch: runtime.poll_oneoff calls the import %d times, want exactly 1", c)
	}
	i := bytes.Index(body, pat)
	out := append([]byte(nil), body[:i]...)
	out = uleb(append(out, opCall), uint64(to))
	return append(out, body[i+len(pat):]...), nil
}

// PatchFile applies PollOneoff to the module at path, in place.
func PatchFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if b, err = PollOneoff(b); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, b, 0o644)
}

// ImportsFunction reports whether the module imports the function module.name (false for
// anything that is not a well-formed module).
func ImportsFunction(mod []byte, module, name string) bool {
	if len(mod) < 8 || !bytes.Equal(mod[:4], []byte("\x00asm")) {
		return false
	}
	secs, err := splitSections(mod[8:])
	if err != nil {
		return false
	}
	for _, s := range secs {
		if s.id != secImport {
			continue
		}
		fns, err := funcImports(s.body)
		if err != nil {
			return false
		}
		for _, f := range fns {
			if f.module == module && f.name == name {
				return true
			}
		}
	}
	return false
}
