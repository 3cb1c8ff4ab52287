// Command rlsbench runs envoyproxy/ratelimit and `sluice serve` side by side
// on one 3-master Redis Cluster under the same gRPC load and prints the
// ratios sluice/peer of decisions/s, p50, p99 and Redis CPU per decision.
//
// Run it from bench/rls (make bench-rls does):
//
//	go run ./cmd/rlsbench [-rounds 3] [-duration 5s] [-concurrency 32]
//	go run ./cmd/rlsbench -envoy [-rounds 5] [-lease 50]   # make bench-rls-envoy
//
// With -envoy it compares them where users run them instead, behind a real Envoy
// (envoy.go): Envoy's own ratelimit filter calling either service, and sluice.wasm's
// backend "rls" with a lease against its local backend; the goals are checked and a
// dated block is added to results.txt.
//
// It builds envoyproxy/ratelimit from this module (pinned in go.mod) and
// sluice from the main module, starts a cluster of Debian's redis-server
// with internal/redistest, starts both services on it with equivalent
// configurations (sluice's is the peer's file plus one descriptor per other
// algorithm), checks that each decides exactly (3 × 100 concurrent calls on
// a fresh value with limit 100 → exactly 100 admitted), then measures. Each
// round runs, per variant ("ok": limits no value reaches; "denied": nearly
// every call over its limit), the peer, then sluice with fixed windows (the
// same configuration), then sluice with each other algorithm, so A and B
// alternate round after round and a machine slowing down hits both. The
// cluster is flushed before each run. Only loopback addresses are used; every
// run is bounded by -warmup + -duration.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

type options struct {
	rounds, concurrency, conns int
	okKeys, deniedKeys         int
	warmup, duration, timeout  time.Duration
	peerOnly                   bool
	peerBin, sluiceBin         string
	sluiceFlags                []string // extra arguments of sluice serve
	algorithms                 []string
	keep                       bool
	// -envoy (envoy.go)
	envoy                  bool
	envoyBin, envoyVersion string
	wasm, out              string
	lease, leaseKeys       int
}

func main() {
	var o options
	var algs string
	flag.IntVar(&o.rounds, "rounds", 3, "interleaved rounds")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "measured span of each run")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each run's measured span")
	flag.IntVar(&o.concurrency, "concurrency", 32, "calls in flight (closed loop)")
	flag.IntVar(&o.conns, "conns", 2, "gRPC connections per service (Envoy opens one per worker)")
	flag.IntVar(&o.okKeys, "ok-keys", 1000, "descriptor values cycled through in the ok variant")
	flag.IntVar(&o.deniedKeys, "denied-keys", 100, "descriptor values cycled through in the denied variant")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Second, "per-call deadline")
	flag.BoolVar(&o.peerOnly, "peer-only", false, "run envoyproxy/ratelimit alone (no sluice serve)")
	flag.StringVar(&o.peerBin, "peer-bin", "", "a prebuilt envoyproxy/ratelimit (default: build it)")
	flag.StringVar(&o.sluiceBin, "sluice-bin", "", "a prebuilt sluice (default: build it from ../..)")
	var sluiceFlags string
	flag.StringVar(&sluiceFlags, "sluice-flags", "", "extra arguments of sluice serve, space-separated (e.g. --charge-denied, with -algorithms fixed_window; with -envoy, of both sluice serve processes)")
	flag.StringVar(&algs, "algorithms", strings.Join(algorithmNames, ","), "sluice algorithms to measure (fixed_window is always measured)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (logs, configurations)")
	flag.BoolVar(&o.envoy, "envoy", false, "compare through a real Envoy instead (envoy.go): its ratelimit filter to either service, and sluice.wasm rls+lease against local; -concurrency is then sluice-load's connections")
	flag.StringVar(&o.envoyBin, "envoy-bin", "", "-envoy: the Envoy binary (default: $ENVOY, else the pinned -envoy-version, fetched when missing)")
	flag.StringVar(&o.envoyVersion, "envoy-version", "1.40.0", "-envoy: the pinned Envoy version when neither -envoy-bin nor $ENVOY is set")
	flag.StringVar(&o.wasm, "wasm", "", "-envoy: a prebuilt sluice.wasm (default: built and patched as make build does)")
	flag.IntVar(&o.lease, "lease", 50, "-envoy: the rls rule's lease")
	flag.IntVar(&o.leaseKeys, "lease-keys", 100, "-envoy: x-key values of the sluice.wasm pair")
	flag.StringVar(&o.out, "out", "results.txt", "-envoy: results file the dated block is added to, newest first (relative to bench/rls; \"-\": none)")
	flag.Parse()
	o.sluiceFlags = strings.Fields(sluiceFlags)
	var err error
	if o.algorithms, err = parseAlgorithms(algs); err == nil {
		err = checkOptions(o)
	}
	if err == nil {
		if o.envoy {
			err = runEnvoy(o)
		} else {
			err = run(o)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rlsbench:", err)
		os.Exit(1)
	}
}

func parseAlgorithms(s string) ([]string, error) {
	out := []string{algorithmNames[0]}
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		if a == "" || a == algorithmNames[0] {
			continue
		}
		known := false
		for _, k := range algorithmNames {
			known = known || a == k
		}
		if !known {
			return nil, fmt.Errorf("-algorithms: unknown %q (one of %s)", a, strings.Join(algorithmNames, ", "))
		}
		out = append(out, a)
	}
	return out, nil
}

func checkOptions(o options) error {
	switch {
	case o.rounds < 1 || o.rounds > 20:
		return fmt.Errorf("-rounds %d: 1..20", o.rounds)
	case o.duration <= 0 || o.duration > 2*time.Minute:
		return fmt.Errorf("-duration %v: up to 2m", o.duration)
	case o.warmup < 0 || o.warmup > time.Minute:
		return fmt.Errorf("-warmup %v: up to 1m", o.warmup)
	case o.concurrency < 1 || o.concurrency > 1024:
		return fmt.Errorf("-concurrency %d: 1..1024", o.concurrency)
	case o.conns < 1 || o.conns > o.concurrency:
		return fmt.Errorf("-conns %d: 1..concurrency", o.conns)
	case o.okKeys < 1 || o.deniedKeys < 1:
		return fmt.Errorf("-ok-keys and -denied-keys must be positive")
	case o.envoy && (o.lease < 1 || o.lease > wasmLimit):
		return fmt.Errorf("-lease %d: 1..%d", o.lease, wasmLimit)
	case o.envoy && (o.leaseKeys < 1 || o.leaseKeys > 10000):
		return fmt.Errorf("-lease-keys %d: 1..10000 (the rule's max_keys)", o.leaseKeys)
	case o.envoy && o.peerOnly:
		return fmt.Errorf("-peer-only does not apply to -envoy")
	}
	return nil
}

const domain = "bench"

// service is one running rate-limit service and its client.
type service struct {
	name string // "peer" or "sluice"
	p    *proc
	c    *client
}

// measurement is one run of one service on one variant.
type measurement struct {
	service, algorithm, variant string
	round                       int
	res                         *result
	redisCPU, serviceCPU        float64 // seconds over the measured span
	commands                    map[string]cmdStat
	reads, writes               int64 // Redis's socket reads and writes over the span
}

// commandProfile is "name calls/decision×µs/call" per command, most calls first.
func (m measurement) commandProfile() string {
	names := make([]string, 0, len(m.commands))
	for n := range m.commands {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(m.commands[b].calls, m.commands[a].calls) })
	var parts []string
	for _, n := range names {
		st := m.commands[n]
		if st.calls == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.2f×%.1fµs", n, float64(st.calls)/float64(m.res.decisions()), float64(st.usec)/float64(st.calls)))
	}
	return strings.Join(parts, ", ")
}

func (m measurement) label() string {
	if m.service == "peer" {
		return "envoyproxy/ratelimit"
	}
	return "sluice " + m.algorithm
}

func (m measurement) redisPerDecision() float64 {
	return m.redisCPU / float64(m.res.decisions()) * 1e6
}

// commandPerDecision is the Redis command time (commandTime) per decision
// in µs; the rest of redisPerDecision is reading, parsing and writing the
// commands and replies, the event loop and the cron.
func (m measurement) commandPerDecision() float64 {
	return float64(commandTime(m.commands)) / float64(m.res.decisions())
}

func (m measurement) readsPerDecision() float64 {
	return float64(m.reads) / float64(m.res.decisions())
}

func (m measurement) servicePerDecision() float64 {
	return m.serviceCPU / float64(m.res.decisions()) * 1e6
}

func run(o options) error {
	dir, err := os.MkdirTemp("", "rlsbench-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("work directory:", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	if err := o.buildBinaries(dir); err != nil {
		return err
	}
	cluster, err := redistest.Start(filepath.Join(dir, "redis"), 3)
	if err != nil {
		return err
	}
	defer cluster.Close()
	fmt.Println("redis cluster:", strings.Join(cluster.Addrs, " "))

	var services []*service
	defer func() {
		for _, s := range services {
			if s.c != nil {
				s.c.close()
			}
			s.p.stop()
		}
	}()
	if err := startServices(o, dir, cluster, &services); err != nil {
		return err
	}
	// Exactness first: a benchmark of a limiter that over-admits means nothing.
	if err := checkExactness(o, services); err != nil {
		return err
	}
	fmt.Printf("\n%d rounds × (peer, sluice × %d algorithm(s)) × 2 variants; %v warm-up + %v measured each; concurrency %d on %d connections\n",
		o.rounds, len(o.algorithms), o.warmup, o.duration, o.concurrency, o.conns)
	ms, err := measureRounds(o, cluster, services)
	if err != nil {
		return err
	}
	fmt.Println()
	fmt.Print(summary(ms, o))
	return nil
}

// buildBinaries builds envoyproxy/ratelimit and sluice into dir unless
// the options name them.
func (o *options) buildBinaries(dir string) error {
	if o.peerBin != "" && (o.sluiceBin != "" || o.peerOnly) {
		return nil
	}
	benchDir, err := benchModuleDir()
	if err != nil {
		return err
	}
	fmt.Println("building envoyproxy/ratelimit and sluice…")
	peerBin, sluiceBin, err := build(benchDir, dir)
	if err != nil {
		return err
	}
	if o.peerBin == "" {
		o.peerBin = peerBin
	}
	if o.sluiceBin == "" {
		o.sluiceBin = sluiceBin
	}
	return nil
}

// startServices starts the peer (and sluice serve unless peer-only) on the
// cluster, appending each to *services as it starts, and waits until each
// answers.
func startServices(o options, dir string, cluster *redistest.Cluster, services *[]*service) error {
	peerCfg, sluiceCfg := configs(domain)
	starters := []struct {
		name string
		f    func() (*proc, string, error)
	}{{"peer", func() (*proc, string, error) { return startPeer(o.peerBin, dir, cluster.Addrs, peerCfg) }}}
	if !o.peerOnly {
		starters = append(starters, struct {
			name string
			f    func() (*proc, string, error)
		}{"sluice", func() (*proc, string, error) {
			return startSluice(o.sluiceBin, dir, cluster.Addrs, sluiceCfg, o.sluiceFlags...)
		}})
	}
	for _, st := range starters {
		p, addr, err := st.f()
		if err != nil {
			return err
		}
		s := &service{name: st.name, p: p}
		*services = append(*services, s)
		if s.c, err = dial(addr, o.conns); err != nil {
			return err
		}
		if err := ready(s.c, domain, "ok", time.Now().Add(30*time.Second)); err != nil {
			return fmt.Errorf("%s: %w\n%s", p.name, err, p.tail())
		}
		fmt.Printf("%s ready on %s (pid %d)\n", p.name, addr, p.cmd.Process.Pid)
	}
	return nil
}

// algorithmsOf is what service s is measured on: the peer has fixed
// windows only.
func algorithmsOf(o options, s *service) []string {
	if s.name == "sluice" {
		return o.algorithms
	}
	return []string{algorithmNames[0]}
}

// checkExactness sends 300 concurrent calls on a fresh value with a limit
// of 100 per day to each service and algorithm, and prints what each
// admitted.
func checkExactness(o options, services []*service) error {
	fmt.Println("\nexactness: 300 concurrent calls on a fresh value, limit 100 per day")
	for _, s := range services {
		for _, a := range algorithmsOf(o, s) {
			value := "probe-" + s.name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			n, err := exact(s.c, domain, descriptorKey("exact", a), value, 3*exactLimit, o.timeout)
			if err != nil {
				return fmt.Errorf("%s %s exactness: %w", s.name, a, err)
			}
			verdict := "exact"
			if n != exactLimit {
				verdict = "NOT EXACT"
			}
			fmt.Printf("  %-28s %d admitted of %d: %s\n", measurement{service: s.name, algorithm: a}.label(), n, 3*exactLimit, verdict)
		}
	}
	return nil
}

// measureRounds measures every service, algorithm and variant (ok,
// denied) in each round, on a flushed cluster each time.
func measureRounds(o options, cluster *redistest.Cluster, services []*service) ([]measurement, error) {
	var ms []measurement
	for round := 1; round <= o.rounds; round++ {
		for _, v := range []struct {
			name string
			keys int
		}{{"ok", o.okKeys}, {"denied", o.deniedKeys}} {
			for _, s := range services {
				for _, a := range algorithmsOf(o, s) {
					if err := flush(cluster); err != nil {
						return nil, err
					}
					m, err := measure(cluster, s, load{
						domain: domain, key: descriptorKey(v.name, a), prefix: "u",
						keys: v.keys, concurrency: o.concurrency,
						warmup: o.warmup, duration: o.duration, timeout: o.timeout,
					})
					if err != nil {
						return nil, err
					}
					m.algorithm, m.variant, m.round = a, v.name, round
					ms = append(ms, m)
					m.print()
					if !s.p.running() {
						return nil, fmt.Errorf("%s exited:\n%s", s.p.name, s.p.tail())
					}
				}
			}
		}
	}
	return ms, nil
}

// print writes one measurement's line and its Redis profile.
func (m measurement) print() {
	fmt.Printf("  round %d %-7s %-28s %8.0f decisions/s  p50 %7v  p99 %7v  redis %6.1f µs/decision  service %6.1f µs/decision  ok %5.1f%%  errors %d\n",
		m.round, m.variant, m.label(), m.res.perSecond(), percentile(m.res.lat, 50).Round(time.Microsecond),
		percentile(m.res.lat, 99).Round(time.Microsecond), m.redisPerDecision(), m.servicePerDecision(),
		100*float64(m.res.ok)/float64(max(1, m.res.decisions())), m.res.errs)
	fmt.Printf("    redis commands per decision × time per call: %s\n", m.commandProfile())
	fmt.Printf("    redis per decision: command time %.1f µs, the rest %.1f µs; %.3f reads, %.3f writes\n",
		m.commandPerDecision(), m.redisPerDecision()-m.commandPerDecision(), m.readsPerDecision(), float64(m.writes)/float64(m.res.decisions()))
	if m.res.errs > 0 {
		fmt.Printf("    first error: %v\n", m.res.firstErr)
	}
}

// flush empties every master, so each run starts from the same state.
func flush(c *redistest.Cluster) error {
	for i := range c.Addrs {
		cl := c.Client(i)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := cl.FlushAll(ctx).Err()
		cancel()
		cl.Close()
		if err != nil {
			return fmt.Errorf("FLUSHALL %s: %w", c.Addrs[i], err)
		}
	}
	return nil
}

// resetStats zeroes the masters' command statistics (CONFIG RESETSTAT;
// used_cpu_* are not reset).
func resetStats(c *redistest.Cluster) error {
	for i := range c.Addrs {
		cl := c.Client(i)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := cl.ConfigResetStat(ctx).Err()
		cancel()
		cl.Close()
		if err != nil {
			return fmt.Errorf("CONFIG RESETSTAT %s: %w", c.Addrs[i], err)
		}
	}
	return nil
}

// clusterCommands sums INFO commandstats over the masters, leaving out the
// harness's own INFO and CONFIG calls.
func clusterCommands(c *redistest.Cluster) (map[string]cmdStat, error) {
	out := map[string]cmdStat{}
	for i := range c.Addrs {
		cl := c.Client(i)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := cl.Info(ctx, "commandstats").Result()
		cancel()
		cl.Close()
		if err != nil {
			return nil, fmt.Errorf("INFO commandstats %s: %w", c.Addrs[i], err)
		}
		if err := commandStats(info, out); err != nil {
			return nil, err
		}
	}
	for _, harness := range []string{"info", "config|resetstat", "flushall", "ping", "hello", "client|setinfo", "cluster|slots", "cluster|nodes", "cluster|info"} {
		delete(out, harness)
	}
	return out, nil
}

// clusterIO sums total_reads_processed and total_writes_processed over the
// masters.
func clusterIO(c *redistest.Cluster) (reads, writes int64, err error) {
	for i := range c.Addrs {
		cl := c.Client(i)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := cl.Info(ctx, "stats").Result()
		cancel()
		cl.Close()
		if err != nil {
			return 0, 0, fmt.Errorf("INFO stats %s: %w", c.Addrs[i], err)
		}
		r, w, err := ioStats(info)
		if err != nil {
			return 0, 0, err
		}
		reads, writes = reads+r, writes+w
	}
	return reads, writes, nil
}

// clusterCPU sums used_cpu_sys + used_cpu_user over the masters.
func clusterCPU(c *redistest.Cluster) (float64, error) {
	var sum float64
	for i := range c.Addrs {
		cl := c.Client(i)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := cl.Info(ctx, "cpu").Result()
		cancel()
		cl.Close()
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s: %w", c.Addrs[i], err)
		}
		v, err := redisCPU(info)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

func measure(c *redistest.Cluster, s *service, l load) (measurement, error) {
	var r0, r1 float64
	var s0, s1 int64
	var io0, io1 [2]int64
	var errs []error
	var cmds map[string]cmdStat
	res := l.run(s.c, func(begin bool) {
		if begin {
			if err := resetStats(c); err != nil {
				errs = append(errs, err)
			}
		} else {
			var err error
			if cmds, err = clusterCommands(c); err != nil {
				errs = append(errs, err)
			}
		}
		r, err := clusterCPU(c)
		if err != nil {
			errs = append(errs, err)
		}
		t, err := s.p.cpuTicks()
		if err != nil {
			errs = append(errs, err)
		}
		rd, wr, err := clusterIO(c)
		if err != nil {
			errs = append(errs, err)
		}
		if begin {
			r0, s0, io0 = r, t, [2]int64{rd, wr}
		} else {
			r1, s1, io1 = r, t, [2]int64{rd, wr}
		}
	})
	if len(errs) > 0 {
		return measurement{}, errs[0]
	}
	if res.decisions() == 0 {
		return measurement{}, fmt.Errorf("%s: no decision in %v (first error: %v)\n%s", s.p.name, l.duration, res.firstErr, s.p.tail())
	}
	// The harness's own INFO calls in the span (a read and a write each
	// per master: commandstats, cpu, stats at the end) are left out.
	n := int64(3 * len(c.Addrs))
	return measurement{service: s.name, res: res, redisCPU: r1 - r0, serviceCPU: float64(s1-s0) / clockTicks, commands: cmds,
		reads: io1[0] - io0[0] - n, writes: io1[1] - io0[1] - n}, nil
}
