package main

import (
	"encoding/json"
	"fmt"
	"github.com/sluice-proxy/sluice/bench/internal/envoyconf"
)

// keyHeader carries the rate-limit key in every measured request (sluice-load -key-header).
const keyHeader = "x-key"

// Limits: "admitted" is far above any load this machine can offer; "denied" is 1 per hour,
// so once every key has been used (the warm-up) every request is refused.
const (
	admitLimit = 1_000_000_000 // per second
	denyLimit  = 1             // per hour
)

// family is one filter setup, measured on the variants (all, or the baseline's one).
type family struct {
	name string
	what string
	// "none", "noop", "denier", "counter", "native", "sluice" (sluice.wasm), "dynmod"
	// (libsluice.so), "dm-c" (the C no-op dynamic module)
	kind string
	// sluice and dynmod only
	algorithm string // token_bucket, sliding_window
	headers   string // response headers: none, both
	never     bool   // the rule matches path_prefix /never/: no request is ever limited
	// observe is more top-level members of the configuration: "access_log", "top_keys"
	// (the families measuring their cost against tb-none; throughput only)
	observe string
	// baseline families are measured on one variant only (the filter ignores keys):
	// baselineVariant, or only when set.
	baseline bool
	only     string
	// b is set on the copy of a sluice family that loads the -wasm-b module (its name ends
	// in "-b"): the same configuration, the other module, in the same rounds.
	b string
}

// floor reports whether f is one of the floors (deny-floor, admit-floor): modules that do
// the least a Proxy-Wasm limiter must, measured in the throughput phase only.
func (f family) floor() bool { return f.kind == "denier" || f.kind == "counter" }

// dynmod reports whether f is a dynamic module's family (libsluice.so or the C no-op): Envoy
// loads it from the search path, not as Wasm.
func (f family) dynmod() bool { return f.kind == "dynmod" || f.kind == "dm-c" }

// limiter reports whether f is one of sluice's rate-limiting families, on either artifact.
func (f family) limiter() bool { return f.kind == "sluice" || f.kind == "dynmod" && !f.baseline }

// variantName is the variant a baseline family is measured on.
func (f family) variantName() string {
	if f.only != "" {
		return f.only
	}
	return baselineVariant
}

// variant is a key spread and an outcome.
type variant struct {
	name string
	keys int  // distinct values of keyHeader, round-robin
	deny bool // limit 1 per hour, keys exhausted by the warm-up
}

var families = []family{
	{name: "none", what: "no HTTP filter but the router", kind: "none", baseline: true},
	{name: "noop", what: "no-op standard-Go Proxy-Wasm module (host/testdata/guests/minimal, patched as sluice.wasm)", kind: "noop", baseline: true},
	{name: "deny-floor", what: "a standard-Go Proxy-Wasm module that refuses every request with a 429 and two headers, nothing else (host/testdata/guests/denier, patched as sluice.wasm): the least a Proxy-Wasm denial costs", kind: "denier", baseline: true, only: "deny-1k"},
	{name: "admit-floor", what: "a standard-Go Proxy-Wasm module that, per request, reads x-key, the clock and the key's shared-data entry and writes it back with compare-and-swap, nothing else (host/testdata/guests/counter, patched as sluice.wasm): the least an exact shared-data limiter's admission costs", kind: "counter", baseline: true},
	{name: "native", what: "Envoy's local_ratelimit: a token bucket per x-key value (dynamic descriptor, max_dynamic_descriptors 2000)", kind: "native"},
	{name: "tb-none", what: "sluice token_bucket on x-key, response headers none", kind: "sluice", algorithm: "token_bucket", headers: "none"},
	{name: "tb-both", what: "sluice token_bucket on x-key, response headers both", kind: "sluice", algorithm: "token_bucket", headers: "both"},
	{name: "sw-none", what: "sluice sliding_window on x-key, response headers none", kind: "sluice", algorithm: "sliding_window", headers: "none"},
	// The dynamic module, libsluice.so: its families after Wasm's, so that the Wasm families
	// keep their places.
	{name: "dm-noop-c", what: "a no-op C dynamic module: every hook Envoy requires, per request one read of x-key and Continue, nothing else (bench/envoy/testdata/noop_dynmod.c, gcc -O2): the least a dynamic module costs", kind: "dm-c", baseline: true},
	{name: "dm-noop-go", what: "the dynamic module libsluice.so with one rule that never matches (path_prefix /never/): one entry into the Go runtime per request and nothing done, the Go runtime's floor", kind: "dynmod", algorithm: "token_bucket", headers: "none", never: true, baseline: true},
	{name: "dm-tb-none", what: "the dynamic module libsluice.so configured as tb-none", kind: "dynmod", algorithm: "token_bucket", headers: "none"},
	{name: "dm-tb-both", what: "the dynamic module libsluice.so configured as tb-both", kind: "dynmod", algorithm: "token_bucket", headers: "both"},
	{name: "dm-sw-none", what: "the dynamic module libsluice.so configured as sw-none", kind: "dynmod", algorithm: "sliding_window", headers: "none"},
}

// observeFamilies measure what "who is limited, and why" costs an admitted request, against
// tb-none and dm-tb-none: run only when -families names them.
var observeFamilies = []family{
	{name: "tb-alog", what: "tb-none with access_log at near_limit_percent 100: every request writes its decision (5 filter-state objects), the worst case", kind: "sluice", algorithm: "token_bucket", headers: "none", observe: obsAccessLog},
	{name: "tb-top", what: "tb-none with top_keys (size 64, raw keys): every request counted in the rule's summary, merged into shared data each second", kind: "sluice", algorithm: "token_bucket", headers: "none", observe: obsTopKeys},
	{name: "dm-tb-alog", what: "the dynamic module libsluice.so configured as tb-alog (5 dynamic-metadata fields per request)", kind: "dynmod", algorithm: "token_bucket", headers: "none", observe: obsAccessLog},
	{name: "dm-tb-top", what: "the dynamic module libsluice.so configured as tb-top", kind: "dynmod", algorithm: "token_bucket", headers: "none", observe: obsTopKeys},
}

const (
	obsAccessLog = `"access_log":{"key":"hashed","near_limit_percent":100}`
	obsTopKeys   = `"top_keys":{"size":64,"key":"raw"}`
)

// The dynamic modules' names: Envoy loads lib<name>.so from $ENVOY_DYNAMIC_MODULES_SEARCH_PATH,
// a directory holding both (one libsluice.so per process: one Go runtime serves every
// configuration of the dynamic-module families).
const (
	dynmodSluice = "sluice"
	dynmodNoop   = "noopdm"
)

// dynmodLib is the file of a dynamic module in the search path.
func dynmodLib(name string) string { return "lib" + name + ".so" }

var variants = []variant{
	{name: "admit-1", keys: 1},
	{name: "admit-1k", keys: 1000},
	{name: "deny-1", keys: 1, deny: true},
	{name: "deny-1k", keys: 1000, deny: true},
}

// baselineVariant is the variant the baseline families are measured on.
const baselineVariant = "admit-1k"

// wantStatus is the status every measured request of v must get.
func (v variant) wantStatus() int {
	if v.deny {
		return 429
	}
	return 200
}

// setup is one measured configuration: a family on a variant.
type setup struct {
	f family
	v variant
}

func (c setup) name() string { return c.f.name + " " + c.v.name }

// ruleName is sluice's rule of a configuration: distinct per configuration, as the wasmcustom
// metrics of the VMs of one process share their names.
func (c setup) ruleName() string { return c.f.name + "-" + c.v.name }

// pluginConfig is sluice's configuration for a variant of a sluice family (either artifact).
func pluginConfig(f family, v variant) string {
	limit, window := admitLimit, "1s"
	if v.deny {
		limit, window = denyLimit, "1h"
	}
	match := ""
	if f.never {
		match = `"match":{"path_prefix":"/never/"},`
	}
	observe := ""
	if f.observe != "" {
		observe = "," + f.observe
	}
	return fmt.Sprintf(`{"rules":[{"name":%q,%s"key":[{"header":%q}],"algorithm":%q,"limit":%d,"window":%q}],"response":{"headers":%q}%s}`,
		setup{f, v}.ruleName(), match, keyHeader, f.algorithm, limit, window, f.headers, observe)
}

// listenerName is the listener serving a configuration.
func listenerName(c setup) string { return "c-" + c.f.name + "-" + c.v.name }

// vmID is the Wasm VM of a family: one per family, so that the families loaded in one
// process keep apart (their own heaps and shared data), as in a process of their own.
func vmID(f family) string { return f.name }

// listenerSpec is one measured listener of a bootstrap.
type listenerSpec struct {
	c     setup
	port  int  // 0: a free port, read back from the admin endpoint
	exact bool // exact connection balance across the workers
}

// bootstrapSpec is what a bootstrap holds besides the admin endpoint: the upstream's port,
// the modules and the measured listeners.
type bootstrapSpec struct {
	title        string // for the header comment
	upstreamPort int
	wasm, noop   string // sluice.wasm and the no-op module
	denier       string // the deny-everything module (family deny-floor)
	counter      string // the count-every-key module (family admit-floor)
	listeners    []listenerSpec
}

// sharedSpec is the bootstrap of a throughput round: one listener per configuration of
// every family given, all in one process.
func sharedSpec(fams []family, wasm, noop, denier, counter string, upstreamPort int) bootstrapSpec {
	s := bootstrapSpec{title: "every configuration, one listener each", upstreamPort: upstreamPort, wasm: wasm, noop: noop, denier: denier, counter: counter}
	for _, c := range configurations(fams) {
		s.listeners = append(s.listeners, listenerSpec{c: c})
	}
	return s
}

// familySpec is the bootstrap of one family alone (memory, start-up): its admit-1k listener,
// on port (0: free), with exact connection balance.
func familySpec(f family, wasm, noop string, upstreamPort, port int) bootstrapSpec {
	return bootstrapSpec{title: "family " + f.name + " alone", upstreamPort: upstreamPort, wasm: wasm, noop: noop,
		listeners: []listenerSpec{{c: setup{f, variantNamed(baselineVariant)}, port: port, exact: true}}}
}

func variantNamed(n string) variant {
	for _, v := range variants {
		if v.name == n {
			return v
		}
	}
	panic("no variant " + n)
}

// renderBootstrap renders an Envoy bootstrap: an admin endpoint on a free loopback port, the
// upstream (a direct response from a listener of the same Envoy on spec.upstreamPort) and
// one listener per spec.listeners, each with its family's filter before the router.
func renderBootstrap(spec bootstrapSpec) ([]byte, error) {
	d := envoyconf.Bootstrap{Title: "bench/envoy, " + spec.title, UpstreamPort: spec.upstreamPort}
	for _, ls := range spec.listeners {
		f, v := ls.c.f, ls.c.v
		l := envoyconf.Listener{Name: listenerName(ls.c), Port: ls.port, Exact: ls.exact}
		fc := &l.Filters
		fc.StatPrefix = l.Name
		switch f.kind {
		case "none":
		case "noop":
			fc.VMID, fc.WasmPath, fc.Plugin = vmID(f), spec.noop, `""`
		case "denier":
			fc.VMID, fc.WasmPath, fc.Plugin = vmID(f), spec.denier, `""`
		case "counter":
			fc.VMID, fc.WasmPath, fc.Plugin = vmID(f), spec.counter, `""`
		case "native":
			fc.Native, fc.Tokens, fc.FillSecs = true, admitLimit, 1
			if v.deny {
				fc.Tokens, fc.FillSecs = denyLimit, 3600
			}
		case "sluice":
			b, _ := json.Marshal(pluginConfig(f, v))
			path := spec.wasm
			if f.b != "" {
				path = f.b
			}
			fc.VMID, fc.WasmPath, fc.Plugin = vmID(f), path, string(b)
		case "dynmod":
			b, _ := json.Marshal(pluginConfig(f, v))
			fc.DynModule, fc.DynFilter, fc.Plugin = dynmodSluice, "sluice", string(b)
		case "dm-c":
			fc.DynModule, fc.DynFilter, fc.Plugin = dynmodNoop, "noop", `""`
		default:
			return nil, fmt.Errorf("family %s: unknown kind %q", f.name, f.kind)
		}
		d.Listeners = append(d.Listeners, l)
	}
	return d.YAML()
}
