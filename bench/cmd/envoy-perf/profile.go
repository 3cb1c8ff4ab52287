package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// frame is one entry of a sample's call chain, leaf first.
type frame struct {
	addr uint64
	sym  string // "[unknown]" when perf has no name
	dso  string
}

// sample is one perf sample: the thread's name and its call chain, leaf first.
type sample struct {
	comm   string
	frames []frame
}

// parseScript reads `perf script -F comm,tid,ip,sym,dso` output of a recording with call
// chains: a header line per sample (comm, tid), then one indented line per frame
// ("ADDR SYM (DSO)"), then a blank line.
func parseScript(r io.Reader) ([]sample, error) {
	var out []sample
	var cur *sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	flush := func() {
		if cur != nil && len(cur.frames) > 0 {
			out = append(out, *cur)
		}
		cur = nil
	}
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if line[0] != ' ' && line[0] != '\t' {
			flush()
			f := strings.Fields(line)
			comm := line
			if len(f) >= 2 {
				comm = strings.Join(f[:len(f)-1], " ")
			}
			cur = &sample{comm: comm}
			continue
		}
		if cur == nil {
			continue
		}
		fr, ok := parseFrame(strings.TrimSpace(line))
		if !ok {
			return nil, fmt.Errorf("perf script: unexpected line %q", line)
		}
		cur.frames = append(cur.frames, fr)
	}
	flush()
	return out, sc.Err()
}

func parseFrame(s string) (frame, bool) {
	sp := strings.IndexByte(s, ' ')
	if sp < 0 {
		return frame{}, false
	}
	addr, err := strconv.ParseUint(s[:sp], 16, 64)
	if err != nil {
		return frame{}, false
	}
	rest := s[sp+1:]
	fr := frame{addr: addr, sym: rest}
	if i := strings.LastIndex(rest, " ("); i >= 0 && strings.HasSuffix(rest, ")") {
		fr.sym, fr.dso = rest[:i], rest[i+2:len(rest)-1]
	}
	return fr, true
}

// kind of code a frame is in.
type kind int

const (
	kJIT    kind = iota // V8's generated code: the guest's compiled functions, V8's stubs and builtins
	kKernel             // the kernel
	kEnvoy              // the Envoy executable (C++: Envoy, proxy-wasm-cpp-host, V8's runtime)
	kLib                // shared libraries (libc, libm, the vDSO)
)

// classifier sorts samples into sides; envoy is the executable's path as perf names it.
type classifier struct {
	envoy string
	// entry holds the return addresses of the Envoy frames just below the guest's outermost
	// frame (V8's call into generated code, the C API's Func::call, proxy-wasm-cpp-host's call
	// wrapper): a sample without guest frames whose chain holds one of them was taken in the
	// machinery of a call into the guest, outside the guest.
	entry map[uint64]bool
}

// entryDepth is how many Envoy frames below the guest's outermost frame are the machinery
// of the call into the guest (see classifier.entry).
const entryDepth = 3

var jitMap = regexp.MustCompile(`(^|/)perf-[0-9]+\.map$`)

func (c *classifier) kind(f frame) kind {
	switch {
	case strings.HasPrefix(f.dso, "[kernel") || f.addr >= 0xffff800000000000:
		return kKernel
	case jitMap.MatchString(f.dso) || strings.HasPrefix(f.dso, "//anon") || strings.HasPrefix(f.dso, "[anon") || f.dso == "[unknown]":
		return kJIT
	case f.dso == c.envoy:
		return kEnvoy
	default:
		return kLib
	}
}

// wasmFunc matches V8's perf-map name of a compiled wasm function: "JS:" (V8 logs wasm
// code with the JS tag), the name from the module's name section, "-INDEX-TIER".
var wasmFunc = regexp.MustCompile(`^JS:(.*)-([0-9]+)-(turbofan|liftoff)$`)

// guestName is the wasm function's name in the module (Go's package path shortened), or "".
func guestName(sym string) string {
	m := wasmFunc.FindStringSubmatch(sym)
	if m == nil {
		return ""
	}
	n := strings.ReplaceAll(m[1], "github.com_sluice_proxy_sluice_", "")
	return n
}

// outermostJIT is the index of the rootmost JIT frame of s, or -1.
func (c *classifier) outermostJIT(s sample) int {
	for i := len(s.frames) - 1; i >= 0; i-- {
		if c.kind(s.frames[i]) == kJIT {
			return i
		}
	}
	return -1
}

func (c *classifier) learnEntry(ss []sample) {
	c.entry = map[uint64]bool{}
	for _, s := range ss {
		k := c.outermostJIT(s)
		if k < 0 {
			continue
		}
		for d := 1; d <= entryDepth && k+d < len(s.frames); d++ {
			if c.kind(s.frames[k+d]) != kEnvoy {
				break
			}
			c.entry[s.frames[k+d].addr] = true
		}
	}
}

// Sides of the process's CPU.
const (
	sideGuest  = "guest wasm code"
	sideStubs  = "V8 generated stubs"
	sideHost   = "host calls"
	sideEntry  = "calls into the guest"
	sideEnvoy  = "Envoy"
	sideKernel = "kernel"
)

var sides = []string{sideGuest, sideStubs, sideHost, sideEntry, sideEnvoy, sideKernel}

var sideWhat = map[string]string{
	sideGuest:  "the module's compiled functions (self time)",
	sideStubs:  "V8's generated code that is not a module function: wasm-to-C++ and entry wrappers, builtins",
	sideHost:   "everything below a guest frame: the C API callback, proxy-wasm-cpp-host, Envoy's host functions, libc and the kernel under them",
	sideEntry:  "Envoy code inside V8's call into the guest (the C API's Func::call and what it calls) but outside the guest",
	sideEnvoy:  "the rest of Envoy and its libraries: HTTP codec, connection manager, router, the wasm filter's own work, the upstream",
	sideKernel: "the kernel, not under a guest frame: sockets, epoll, scheduling",
}

// breakdown is the sorted samples of one recording.
type breakdown struct {
	total  int
	side   map[string]int
	guest  map[string]int // self samples per guest function
	stubs  map[string]int // self samples per stub name
	host   map[string]int // host-call samples per guest function that made the call
	hostK  int            // host-call samples in the kernel
	hostN  map[string]int // host-call samples inside a nested call into the guest, per guest caller
	hostL  map[string]int // host-call samples per library symbol (libc, vDSO)
	envoyL map[string]int // Envoy-side samples per library symbol
	envoyX int            // Envoy-side samples in the executable
	comm   map[string]int
	named  bool // the JIT code had names (a perf map)
}

func (c *classifier) sort(ss []sample) breakdown {
	c.learnEntry(ss)
	b := breakdown{side: map[string]int{}, guest: map[string]int{}, stubs: map[string]int{}, host: map[string]int{},
		hostN: map[string]int{}, hostL: map[string]int{}, envoyL: map[string]int{}, comm: map[string]int{}}
	for _, s := range ss {
		b.total++
		b.comm[s.comm]++
		leaf := s.frames[0]
		lk := c.kind(leaf)
		if lk == kJIT {
			if jitMap.MatchString(leaf.dso) {
				b.named = true
			}
			if n := guestName(leaf.sym); n != "" {
				b.side[sideGuest]++
				b.guest[n]++
			} else {
				b.side[sideStubs]++
				b.stubs[leaf.sym]++
			}
			continue
		}
		caller, under, nested := "", false, false
		for _, f := range s.frames[1:] {
			if !under && c.entry[f.addr] {
				nested = true // below the host call, Envoy calls the guest again (its allocator)
			}
			if c.kind(f) == kJIT {
				under = true
				if n := guestName(f.sym); n != "" {
					caller = n
					break
				}
			}
		}
		if under {
			b.side[sideHost]++
			if caller == "" {
				caller = "(no named guest frame)"
			}
			b.host[caller]++
			if nested {
				b.hostN[caller]++
			}
			switch lk {
			case kKernel:
				b.hostK++
			case kLib:
				b.hostL[libSym(leaf)]++
			}
			continue
		}
		entry := false
		for _, f := range s.frames[1:] {
			if c.entry[f.addr] {
				entry = true
				break
			}
		}
		switch {
		case entry:
			b.side[sideEntry]++
		case lk == kKernel:
			b.side[sideKernel]++
		default:
			b.side[sideEnvoy]++
			if lk == kLib {
				b.envoyL[libSym(leaf)]++
			} else {
				b.envoyX++
			}
		}
	}
	return b
}

func libSym(f frame) string {
	dso := f.dso[strings.LastIndexByte(f.dso, '/')+1:]
	return f.sym + " (" + dso + ")"
}

type count struct {
	name string
	n    int
}

func sorted(m map[string]int) []count {
	var cs []count
	for k, v := range m {
		cs = append(cs, count{k, v})
	}
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].n != cs[j].n {
			return cs[i].n > cs[j].n
		}
		return cs[i].name < cs[j].name
	})
	return cs
}

// write prints the breakdown: shares per side (and µs per request when usPerReq > 0), then
// the top items of each side.
func (b breakdown) write(w io.Writer, usPerReq float64, top int) {
	pct := func(n int) float64 { return 100 * float64(n) / float64(b.total) }
	fmt.Fprintf(w, "%d samples", b.total)
	for _, c := range sorted(b.comm) {
		fmt.Fprintf(w, " · %s %.1f%%", c.name, pct(c.n))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  %-22s %7s %10s\n", "side", "share", "µs/request")
	for _, s := range sides {
		us := ""
		if usPerReq > 0 {
			us = fmt.Sprintf("%10.2f", usPerReq*float64(b.side[s])/float64(b.total))
		}
		fmt.Fprintf(w, "  %-22s %6.1f%% %s   %s\n", s, pct(b.side[s]), us, sideWhat[s])
	}
	list := func(title string, m map[string]int) {
		cs := sorted(m)
		if len(cs) == 0 {
			return
		}
		fmt.Fprintf(w, "\n%s\n", title)
		for i, c := range cs {
			if i == top {
				rest := 0
				for _, c := range cs[i:] {
					rest += c.n
				}
				fmt.Fprintf(w, "  %6.2f%%  (%d more)\n", pct(rest), len(cs)-i)
				break
			}
			fmt.Fprintf(w, "  %6.2f%%  %s\n", pct(c.n), c.name)
		}
	}
	list("guest functions (self):", b.guest)
	list(fmt.Sprintf("host calls, by the guest function that made them (kernel under them %.2f%%):", pct(b.hostK)), b.host)
	list("host calls: the part inside Envoy's nested call into the guest (proxy_on_memory_allocate for a returned value), outside the guest:", b.hostN)
	list("host calls ending in a library:", b.hostL)
	list("V8 generated stubs:", b.stubs)
	fmt.Fprintf(w, "\nEnvoy side: %.1f%% in the executable (stripped: no names), in libraries:\n", pct(b.envoyX))
	cs := sorted(b.envoyL)
	for i, c := range cs {
		if i == top/2 {
			break
		}
		fmt.Fprintf(w, "  %6.2f%%  %s\n", pct(c.n), c.name)
	}
}
