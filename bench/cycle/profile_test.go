package cycle

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/sluice-proxy/sluice/host"
)

// BenchmarkGuestProfile shows where the guest's instructions go for one request cycle: it
// compiles sluice.wasm with a wazero function listener on every function (guest and host
// imports), runs requests through the embedded host (in process, one worker) and prints, per
// request, how often each function was called and the time spent in it (self: minus its
// callees; inclusive), sorted by self time. The listener's own cost (two clock reads per
// call) inflates functions with many calls, so read the call counts as exact and the times
// as a ranking. SLUICE_PROFILE picks the configuration: allow (default: token_bucket on
// x-key, 1,000 keys, headers "none"), allow-both (headers "both"), deny, nomatch, noop (the no-op
// module); SLUICE_PROFILE_TOP
// the number of rows (default 40); SLUICE_PROFILE_EXPORTS=1 listens to the callbacks and host
// calls only (their times then carry little listener overhead: where a request's time goes
// between the guest's callbacks and the host's calls).
//
//	SLUICE_PROFILE=allow go test ./bench/cycle -run '^$' -bench '^BenchmarkGuestProfile$' -benchtime 2000x
func BenchmarkGuestProfile(b *testing.B) {
	wasm := sluiceModule(b)
	mod, err := os.ReadFile(wasm)
	if err != nil {
		b.Fatal(err)
	}
	which := os.Getenv("SLUICE_PROFILE")
	if which == "" {
		which = "allow"
	}
	top := 40
	if v, err := strconv.Atoi(os.Getenv("SLUICE_PROFILE_TOP")); err == nil && v > 0 {
		top = v
	}
	pc, ok := profileConfigs[which]
	if which == "noop" { // the no-op module, for the exports' floor (SLUICE_PROFILE_EXPORTS=1)
		mod, pc, ok = noopModule(b), profileConfig{"", 0, 200}, true
	}
	if !ok {
		b.Fatalf("SLUICE_PROFILE=%q: want one of allow, allow-both, deny, nomatch, noop", which)
	}
	prof := newGuestProfile()
	prof.exportsOnly = os.Getenv("SLUICE_PROFILE_EXPORTS") == "1"
	ctx := experimental.WithFunctionListenerFactory(context.Background(), prof)
	// A cache of its own: a module compiled without listeners (by an earlier run) has none.
	h, err := host.New(ctx, host.Options{Wasm: mod, PluginConfig: []byte(pc.config), Workers: 1,
		CompilationCache: wazero.NewCompilationCache()})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close(context.Background())
	reqs := benchRequests(max(pc.keys, 1))
	up := func(*host.Request) *host.Response {
		return &host.Response{Status: 200, Headers: [][2]string{{"content-type", "text/plain"}}}
	}
	if pc.status == 429 {
		h.Exchange(context.Background(), reqs[0], up)
	}
	// Warm up (every key once: the slots exist), then count.
	for i := range reqs {
		h.Exchange(context.Background(), reqs[i], up)
	}
	prof.reset()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := h.Exchange(context.Background(), reqs[i%len(reqs)], up)
		if err != nil || resp.Status != pc.status {
			b.Fatalf("response %+v, %v; want status %d", resp, err, pc.status)
		}
	}
	b.StopTimer()
	if b.N > 1 {
		b.Log("\n" + prof.report(b.N, top))
	}
}

type profileConfig struct {
	config string
	keys   int
	status int
}

var profileConfigs = map[string]profileConfig{
	"allow":      {`{"rules":[{"name":"bench","key":[{"header":"x-key"}],"algorithm":"token_bucket","limit":1000000000,"window":"1h"}],"response":{"headers":"none"}}`, 1000, 200},
	"allow-both": {`{"rules":[{"name":"bench","key":[{"header":"x-key"}],"algorithm":"token_bucket","limit":1000000000,"window":"1h"}],"response":{"headers":"both"}}`, 1000, 200},
	"deny":       {`{"rules":[{"name":"bench","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1,"window":"1h"}],"response":{"headers":"both"}}`, 0, 429},
	"nomatch":    {`{"rules":[{"name":"bench","match":{"headers":[{"name":"x-never","exact":"1"}]},"key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1,"window":"1h"}],"response":{"headers":"both"}}`, 0, 200},
}

// benchRequests returns n requests shaped like the load generator's, the i-th with x-key ki.
func benchRequests(n int) []*host.Request {
	reqs := make([]*host.Request, n)
	for i := range reqs {
		reqs[i] = &host.Request{Method: "GET", Path: "/api/items?id=7", Authority: "example.test",
			Headers:    [][2]string{{"user-agent", "bench"}, {"accept", "*/*"}, {"x-key", "k" + strconv.Itoa(i)}},
			RemoteAddr: "192.0.2.10:40000"}
	}
	return reqs
}

// guestProfile is a FunctionListenerFactory that counts calls and times per function. One
// worker: the guest is single-threaded, so no locking.
type guestProfile struct {
	funcs map[string]*funcStat
	stack []frame
	// exportsOnly listens to the exports and the host calls only (SLUICE_PROFILE_EXPORTS=1):
	// two listened functions per callback and host call instead of one per guest call, so
	// each callback's inclusive time and each host call's time are close to the unlistened.
	exportsOnly bool
}

type funcStat struct {
	name      string
	host      bool
	calls     int64
	self, inc time.Duration
}

type frame struct {
	f      *funcStat
	start  time.Time
	callee time.Duration
}

func newGuestProfile() *guestProfile { return &guestProfile{funcs: map[string]*funcStat{}} }

func (p *guestProfile) reset() {
	for _, f := range p.funcs {
		f.calls, f.self, f.inc = 0, 0, 0
	}
}

func (p *guestProfile) NewFunctionListener(def api.FunctionDefinition) experimental.FunctionListener {
	name := def.DebugName()
	if p.exportsOnly && len(def.ExportNames()) == 0 {
		if _, _, isImport := def.Import(); !isImport && def.GoFunction() == nil {
			return nil
		}
	}
	f := p.funcs[name]
	if f == nil {
		_, _, isImport := def.Import()
		f = &funcStat{name: name, host: isImport || def.GoFunction() != nil}
		p.funcs[name] = f
	}
	return &funcListener{p: p, f: f}
}

type funcListener struct {
	p *guestProfile
	f *funcStat
}

func (l *funcListener) Before(context.Context, api.Module, api.FunctionDefinition, []uint64, experimental.StackIterator) {
	l.f.calls++
	l.p.stack = append(l.p.stack, frame{f: l.f, start: time.Now()})
}

func (l *funcListener) After(context.Context, api.Module, api.FunctionDefinition, []uint64) {
	l.p.pop()
}

func (l *funcListener) Abort(context.Context, api.Module, api.FunctionDefinition, error) {
	l.p.pop()
}

func (p *guestProfile) pop() {
	n := len(p.stack)
	if n == 0 {
		return
	}
	fr := p.stack[n-1]
	p.stack = p.stack[:n-1]
	d := time.Since(fr.start)
	fr.f.inc += d
	fr.f.self += d - fr.callee
	if n > 1 {
		p.stack[n-2].callee += d
	}
}

func (p *guestProfile) report(n, top int) string {
	fs := make([]*funcStat, 0, len(p.funcs))
	var calls, hostCalls int64
	var self time.Duration
	for _, f := range p.funcs {
		if f.calls == 0 {
			continue
		}
		fs = append(fs, f)
		self += f.self
		if f.host {
			hostCalls += f.calls
		} else {
			calls += f.calls
		}
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].self > fs[j].self })
	var sb strings.Builder
	per := float64(n)
	fmt.Fprintf(&sb, "per request: %.1f guest function calls, %.1f host calls, %.2f µs in listened functions (listener overhead included)\n",
		float64(calls)/per, float64(hostCalls)/per, float64(self.Nanoseconds())/per/1000)
	fmt.Fprintf(&sb, "%-8s %10s %10s %10s  %s\n", "kind", "calls/req", "self µs", "incl µs", "function")
	for i, f := range fs {
		if i == top {
			break
		}
		kind := "guest"
		if f.host {
			kind = "host"
		}
		fmt.Fprintf(&sb, "%-8s %10.2f %10.3f %10.3f  %s\n", kind, float64(f.calls)/per,
			float64(f.self.Nanoseconds())/per/1000, float64(f.inc.Nanoseconds())/per/1000, f.name)
	}
	return sb.String()
}

// BenchmarkCycleAB compares guest modules side by side in one process: SLUICE_AB names
// two or more module files (comma-separated); every round runs each configuration of
// profileConfigs (and the no-op module) on each module in turn, in process (host.Exchange,
// one worker), and prints the process CPU per request and its ratio to the no-op module's
// in that round (SLUICE_AB_ROUNDS rounds, default 5, of SLUICE_AB_N requests, default 3,000).
// For measuring a change to the guest: build the module before and after.
//
//	SLUICE_AB=old.wasm,new.wasm go test ./bench/cycle -run '^$' -bench '^BenchmarkCycleAB$' -benchtime 1x
func BenchmarkCycleAB(b *testing.B) {
	ab := os.Getenv("SLUICE_AB")
	if ab == "" {
		b.Skip("SLUICE_AB is unset: it names the modules to compare (SLUICE_AB=old.wasm,new.wasm)")
	}
	files := strings.Split(ab, ",")
	if len(files) < 2 {
		b.Fatal("SLUICE_AB must name two or more module files, comma-separated")
	}
	mods := make([][]byte, len(files))
	for i, f := range files {
		var err error
		if mods[i], err = os.ReadFile(f); err != nil {
			b.Fatal(err)
		}
	}
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("SLUICE_AB_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	n := 3000 // requests per configuration and round (SLUICE_AB_N)
	if v, err := strconv.Atoi(os.Getenv("SLUICE_AB_N")); err == nil && v > 0 {
		n = v
	}
	names := []string{"allow", "allow-both", "deny", "nomatch"}
	ctx := context.Background()
	type hostCase struct {
		h    *host.Host
		reqs []*host.Request
		pc   profileConfig
	}
	up := func(*host.Request) *host.Response {
		return &host.Response{Status: 200, Headers: [][2]string{{"content-type", "text/plain"}}}
	}
	start := func(mod []byte, pc profileConfig) hostCase {
		h, err := host.New(ctx, host.Options{Wasm: mod, PluginConfig: []byte(pc.config), Workers: 1})
		if err != nil {
			b.Fatal(err)
		}
		hc := hostCase{h, benchRequests(max(pc.keys, 1)), pc}
		if pc.status == 429 {
			h.Exchange(ctx, hc.reqs[0], up)
		}
		for _, r := range hc.reqs {
			h.Exchange(ctx, r, up)
		}
		return hc
	}
	noopCase := start(noopModule(b), profileConfig{"", 0, 200})
	defer noopCase.h.Close(ctx)
	cases := make([][]hostCase, len(mods))
	for i, m := range mods {
		for _, nm := range names {
			hc := start(m, profileConfigs[nm])
			defer hc.h.Close(ctx)
			cases[i] = append(cases[i], hc)
		}
	}
	measure := func(hc hostCase) float64 {
		cpu0 := processCPU()
		for i := 0; i < n; i++ {
			resp, err := hc.h.Exchange(ctx, hc.reqs[i%len(hc.reqs)], up)
			if err != nil || resp.Status != hc.pc.status {
				b.Fatalf("response %+v, %v; want status %d", resp, err, hc.pc.status)
			}
		}
		return float64(processCPU()-cpu0) / float64(n)
	}
	ratios := map[string][]float64{}
	for r := 0; r < rounds; r++ {
		for j, nm := range names {
			var first float64 // the first module's figure in this round
			base := measure(noopCase)
			for i := range mods {
				v := measure(cases[i][j])
				k := fmt.Sprintf("%s %s", nm, files[i])
				ratios[k] = append(ratios[k], v/base)
				ratios[k+" ns"] = append(ratios[k+" ns"], v)
				if i == 0 {
					first = v
				}
				ratios[k+" first"] = append(ratios[k+" first"], v/first)
			}
		}
	}
	var sb strings.Builder
	for _, nm := range names {
		for _, f := range files {
			k := nm + " " + f
			rs, ns, fs := ratios[k], ratios[k+" ns"], ratios[k+" first"]
			sort.Float64s(rs)
			sort.Float64s(ns)
			sort.Float64s(fs)
			fmt.Fprintf(&sb, "%-10s %-30s CPU/request vs no-op %.2f× (%.2f–%.2f), %.1f µs; vs the first module %.2f× (%.2f–%.2f)\n",
				nm, f, rs[len(rs)/2], rs[0], rs[len(rs)-1], ns[len(ns)/2]/1000, fs[len(fs)/2], fs[0], fs[len(fs)-1])
		}
	}
	b.Log("\n" + sb.String())
}
