// Command sluice-load is a small HTTP load generator (closed loop, or open loop at a fixed
// rate) for sluice's load tests, and a trivial echo server to compare against. It only talks to loopback addresses and every run
// is bounded in time and in requests.
//
//	sluice-load -url http://127.0.0.1:8080/ -c 64 -d 10s [-warmup 2s] [-n 5000000]
//	            [-H 'Name: value'] [-keys N -key-header X-Key [-key-bytes B]] [-json]
//	            [-want-status CODE] [-rate R]
//	sluice-load -serve 127.0.0.1:8081      # echo server without any Proxy-Wasm host
//
// -c connections each send requests back to back (keep-alive) for -d after -warmup; the
// report gives requests/s, latency percentiles (p50, p90, p99, max) and the status codes.
// With -keys N, request i carries -key-header with one of N values (round-robin), to spread
// the load over N rate-limit keys; -key-bytes pads each value to B bytes (hostile keys).
// With -want-status, any error or any other status makes the exit status 1.
//
// With -rate R the load is an open loop instead: request k (k = 0, 1, 2, … over the whole
// run, warm-up included) is due at k/R seconds after the start, connection w sending the
// requests k ≡ w (mod -c) in turn. A connection still waiting for its previous response
// sends the next one late, and a request's latency is measured from the time it was due,
// not from when it went out: the queueing a slow server causes is counted (no coordinated
// omission). The requests due during the warm-up are not measured; those due in the
// measured interval all are, in flight at its end or not (the run waits for them). The
// report adds the offered rate, how many requests went out more than 1 ms late, and the
// largest such delay: many late sends mean -c is too small for the rate.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

// Bounds of one run.
const (
	maxDuration    = 2 * time.Minute
	maxConcurrency = 1024
	maxRequests    = 50_000_000
	maxKeyBytes    = 1 << 20
	maxRate        = 1_000_000 // requests/s of an open loop
)

// lateAfter is how late a send of the open loop may go out before it counts as late.
const lateAfter = time.Millisecond

type options struct {
	url         string
	concurrency int
	duration    time.Duration
	warmup      time.Duration
	requests    int64
	headers     http.Header
	keys        int
	keyHeader   string
	keyBytes    int
	wantStatus  int
	jsonOut     bool
	rate        float64 // requests/s of the open loop; 0: closed loop
}

func main() {
	var o options
	var hs headerFlags
	serve := flag.String("serve", "", "serve the trivial echo upstream on this loopback address instead of generating load")
	flag.StringVar(&o.url, "url", "", "target URL (loopback only)")
	flag.IntVar(&o.concurrency, "c", 64, "concurrent connections")
	flag.DurationVar(&o.duration, "d", 10*time.Second, "measured duration")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured warm-up before the measurement")
	flag.Int64Var(&o.requests, "n", 5_000_000, "stop after this many measured requests")
	flag.Var(&hs, "H", "request header 'Name: value' (repeatable)")
	flag.IntVar(&o.keys, "keys", 0, "spread requests over this many values of -key-header (0: none)")
	flag.StringVar(&o.keyHeader, "key-header", "X-Key", "header carrying the -keys values")
	flag.IntVar(&o.keyBytes, "key-bytes", 0, "pad each -keys value to this many bytes (0: no padding)")
	flag.IntVar(&o.wantStatus, "want-status", 0, "exit 1 unless every measured request got this status (0: any)")
	flag.BoolVar(&o.jsonOut, "json", false, "print the report as JSON")
	flag.Float64Var(&o.rate, "rate", 0, "open loop: offer this many requests/s in total, on a fixed timeline (0: closed loop)")
	flag.Parse()
	if *serve != "" {
		if err := serveEcho(*serve); err != nil {
			fmt.Fprintln(os.Stderr, "sluice-load:", err)
			os.Exit(1)
		}
		return
	}
	o.headers = http.Header{}
	for _, h := range hs {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			fmt.Fprintf(os.Stderr, "sluice-load: -H %q: want 'Name: value'\n", h)
			os.Exit(2)
		}
		o.headers.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-load:", err)
		os.Exit(2)
	}
	rep, err := run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-load:", err)
		os.Exit(1)
	}
	if o.jsonOut {
		json.NewEncoder(os.Stdout).Encode(rep)
	} else {
		rep.print(os.Stdout)
	}
	if err := rep.check(o.wantStatus); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-load:", err)
		os.Exit(1)
	}
}

func (o *options) validate() error {
	u, err := url.Parse(o.url)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("-url: want http://127.0.0.1:PORT/..., got %q", o.url)
	}
	if err := loopback(u.Hostname()); err != nil {
		return fmt.Errorf("-url: %v", err)
	}
	switch {
	case o.concurrency < 1 || o.concurrency > maxConcurrency:
		return fmt.Errorf("-c must be in 1..%d", maxConcurrency)
	case o.duration <= 0 || o.duration > maxDuration:
		return fmt.Errorf("-d must be in (0, %v]", maxDuration)
	case o.warmup < 0 || o.warmup > maxDuration:
		return fmt.Errorf("-warmup must be in [0, %v]", maxDuration)
	case o.requests < 1 || o.requests > maxRequests:
		return fmt.Errorf("-n must be in 1..%d", maxRequests)
	case o.keys < 0:
		return errors.New("-keys must be >= 0")
	case o.keyBytes < 0 || o.keyBytes > maxKeyBytes:
		return fmt.Errorf("-key-bytes must be in 0..%d", maxKeyBytes)
	case o.keyBytes > 0 && o.keys == 0:
		return errors.New("-key-bytes needs -keys")
	case o.wantStatus != 0 && (o.wantStatus < 100 || o.wantStatus > 599):
		return errors.New("-want-status must be an HTTP status")
	case o.rate < 0 || o.rate > maxRate:
		return fmt.Errorf("-rate must be in 0..%d", maxRate)
	case o.rate > 0 && newTimeline(*o).end > maxRequests:
		return fmt.Errorf("-rate × (-warmup + -d) must not exceed %d requests", maxRequests)
	}
	return nil
}

func loopback(host string) error {
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address; this tool only loads 127.0.0.1/::1", host)
	}
	return nil
}

// report is the outcome of one run.
type report struct {
	URL         string         `json:"url"`
	Concurrency int            `json:"concurrency"`
	Seconds     float64        `json:"seconds"`
	Requests    int            `json:"requests"`
	Errors      int64          `json:"errors"`
	RPS         float64        `json:"rps"`
	P50         float64        `json:"p50_ms"`
	P90         float64        `json:"p90_ms"`
	P99         float64        `json:"p99_ms"`
	Max         float64        `json:"max_ms"`
	Statuses    map[string]int `json:"statuses"`
	FirstError  string         `json:"first_error,omitempty"`
	// Open loop only.
	Rate      float64 `json:"rate,omitempty"`        // offered requests/s
	Sent      int64   `json:"sent,omitempty"`        // requests sent, warm-up included
	Late      int     `json:"late,omitempty"`        // measured requests sent more than lateAfter after due
	MaxLateMS float64 `json:"max_late_ms,omitempty"` // the latest send, ms after due
}

func (r *report) print(w io.Writer) {
	codes := make([]string, 0, len(r.Statuses))
	for c := range r.Statuses {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	var st []string
	for _, c := range codes {
		st = append(st, fmt.Sprintf("%s×%d", c, r.Statuses[c]))
	}
	fmt.Fprintf(w, "%s  c=%d  %.1fs\n", r.URL, r.Concurrency, r.Seconds)
	fmt.Fprintf(w, "  requests %d (%s), errors %d\n", r.Requests, strings.Join(st, " "), r.Errors)
	if r.Rate > 0 {
		fmt.Fprintf(w, "  offered %.0f req/s (open loop), %d sent more than %v late (latest %.3f ms)\n", r.Rate, r.Late, lateAfter, r.MaxLateMS)
	}
	fmt.Fprintf(w, "  throughput %.0f req/s\n", r.RPS)
	fmt.Fprintf(w, "  latency p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  max %.3f ms\n", r.P50, r.P90, r.P99, r.Max)
	if r.FirstError != "" {
		fmt.Fprintf(w, "  first error: %s\n", r.FirstError)
	}
}

// check returns an error when want is set and a measured request failed or got another
// status.
func (r *report) check(want int) error {
	if want == 0 {
		return nil
	}
	if r.Errors > 0 {
		return fmt.Errorf("%d requests failed (first: %s)", r.Errors, r.FirstError)
	}
	if n := r.Statuses[strconv.Itoa(want)]; n != r.Requests {
		return fmt.Errorf("%d of %d requests got a status other than %d: %v", r.Requests-n, r.Requests, want, r.Statuses)
	}
	return nil
}

// sample is one measured request.
type sample struct {
	d      time.Duration
	status int16
	late   time.Duration // open loop: how long after due it went out
}

// newClient is the client of every connection: one keep-alive connection per -c, no
// proxy, no compression, each request bounded by 10 s.
func newClient(o options) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        o.concurrency,
		MaxIdleConnsPerHost: o.concurrency,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
}

func run(o options) (*report, error) {
	if o.rate > 0 {
		return runOpen(o)
	}
	client := newClient(o)
	defer client.CloseIdleConnections()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.warmup+o.duration)
	defer cancel()
	l := &loadRun{o: o, client: client, keys: keyValues(o), cancel: cancel}
	// Without a warm-up every request counts, the first ones too.
	l.measuring.Store(o.warmup == 0)
	per := make([][]sample, o.concurrency)
	perCap := int(min(o.requests/int64(o.concurrency)+1, 1<<20))
	var wg sync.WaitGroup
	for w := range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			per[w] = l.connection(ctx, make([]sample, 0, perCap))
		}()
	}
	elapsed := l.measure(ctx)
	wg.Wait()
	return l.report(per, elapsed)
}

// timeline is an open loop's schedule: request k is due at k/rate after the start; the
// requests first ≤ k < end are measured, and no request k ≥ end is sent.
type timeline struct {
	rate       float64
	conc       int
	first, end int64
}

func newTimeline(o options) timeline {
	return timeline{rate: o.rate, conc: o.concurrency,
		first: dueCount(o.warmup, o.rate), end: dueCount(o.warmup+o.duration, o.rate)}
}

// dueCount is how many requests are due before t: the k with k/rate < t.
func dueCount(t time.Duration, rate float64) int64 {
	return int64(math.Ceil(t.Seconds()*rate - 1e-9))
}

// due is when request k is due, as an offset from the start.
func (tl timeline) due(k int64) time.Duration {
	return time.Duration(math.Round(float64(k) * float64(time.Second) / tl.rate))
}

// request is the index of connection w's i-th request (both from 0).
func (tl timeline) request(w, i int) int64 { return int64(i)*int64(tl.conc) + int64(w) }

// runOpen runs the open loop: every connection sends its share of the timeline, then the
// run waits for every request sent (each bounded by the client's timeout).
func runOpen(o options) (*report, error) {
	client := newClient(o)
	defer client.CloseIdleConnections()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	tl := newTimeline(o)
	l := &loadRun{o: o, client: client, keys: keyValues(o)}
	per := make([][]sample, o.concurrency)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := (tl.end - tl.first) / int64(o.concurrency)
			per[w] = l.openConnection(ctx, tl, w, start, make([]sample, 0, min(n+1, 1<<20)))
		}()
	}
	wg.Wait()
	rep, err := l.report(per, o.duration)
	if err != nil {
		return nil, err
	}
	rep.Rate, rep.Sent = o.rate, tl.end
	for _, s := range per {
		for _, x := range s {
			if x.late > lateAfter {
				rep.Late++
			}
			rep.MaxLateMS = max(rep.MaxLateMS, float64(x.late)/float64(time.Millisecond))
		}
	}
	return rep, nil
}

// openConnection sends connection w's requests of the timeline, each at its due time or,
// when the previous one is still out, as soon as it is back; latencies run from due.
func (l *loadRun) openConnection(ctx context.Context, tl timeline, w int, start time.Time, samples []sample) []sample {
	o := l.o
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for i := 0; ; i++ {
		k := tl.request(w, i)
		if k >= tl.end {
			return samples
		}
		due := start.Add(tl.due(k))
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return samples
			}
		}
		if ctx.Err() != nil {
			return samples
		}
		req, _ := http.NewRequest(http.MethodGet, o.url, nil)
		for h, vs := range o.headers {
			req.Header[h] = vs
		}
		if o.keys > 0 {
			req.Header.Set(o.keyHeader, l.keys[k%int64(o.keys)])
		}
		late := time.Since(due)
		resp, err := l.client.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		d := time.Since(due)
		if k < tl.first {
			continue
		}
		if err != nil {
			l.errs.Add(1)
			l.firstErr.CompareAndSwap(nil, err.Error())
			continue
		}
		samples = append(samples, sample{d, int16(resp.StatusCode), max(late, 0)})
	}
}

// keyValues are the -keys values of -key-header, each padded to -key-bytes.
func keyValues(o options) []string {
	keys := make([]string, o.keys)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
		if pad := o.keyBytes - len(keys[i]); pad > 0 {
			keys[i] += strings.Repeat("x", pad)
		}
	}
	return keys
}

// loadRun is what the connections of one run share.
type loadRun struct {
	o         options
	client    *http.Client
	keys      []string
	cancel    context.CancelFunc // ends the run once -n requests are measured
	measuring atomic.Bool        // the warm-up is over
	measured  atomic.Int64
	errs      atomic.Int64
	firstErr  atomic.Value // string
	seq       atomic.Uint64
}

// connection sends requests back to back until ctx ends, and returns samples with the
// measured ones appended.
func (l *loadRun) connection(ctx context.Context, samples []sample) []sample {
	o := l.o
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, o.url, nil)
		for k, vs := range o.headers {
			req.Header[k] = vs
		}
		if o.keys > 0 {
			req.Header.Set(o.keyHeader, l.keys[l.seq.Add(1)%uint64(o.keys)])
		}
		m := l.measuring.Load()
		t0 := time.Now()
		resp, err := l.client.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		d := time.Since(t0)
		if ctx.Err() != nil {
			return samples // cut off by the end of the run: not a result
		}
		if !m {
			continue
		}
		if err != nil {
			l.errs.Add(1)
			l.firstErr.CompareAndSwap(nil, err.Error())
			continue
		}
		samples = append(samples, sample{d: d, status: int16(resp.StatusCode)})
		if l.measured.Add(1) >= o.requests {
			l.cancel()
		}
	}
	return samples
}

// measure waits out the warm-up, then measures until the run ends (its duration, -n
// requests or an interrupt) and returns for how long it measured.
func (l *loadRun) measure(ctx context.Context) time.Duration {
	if l.o.warmup > 0 {
		select {
		case <-time.After(l.o.warmup):
		case <-ctx.Done():
		}
	}
	l.measuring.Store(true)
	began := time.Now()
	<-ctx.Done()
	return time.Since(began)
}

// report sums up the connections' samples: throughput over elapsed, latency percentiles
// and status counts.
func (l *loadRun) report(per [][]sample, elapsed time.Duration) (*report, error) {
	var all []time.Duration
	statuses := map[string]int{}
	for _, s := range per {
		for _, x := range s {
			all = append(all, x.d)
			statuses[strconv.Itoa(int(x.status))]++
		}
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("no request completed (errors: %d, first: %v)", l.errs.Load(), l.firstErr.Load())
	}
	slices.Sort(all)
	q := func(p float64) float64 {
		i := int(p * float64(len(all)-1))
		return float64(all[i]) / float64(time.Millisecond)
	}
	rep := &report{
		URL: l.o.url, Concurrency: l.o.concurrency, Seconds: elapsed.Seconds(),
		Requests: len(all), Errors: l.errs.Load(), RPS: float64(len(all)) / elapsed.Seconds(),
		P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: q(1),
		Statuses: statuses,
	}
	if e, ok := l.firstErr.Load().(string); ok {
		rep.FirstError = e
	}
	return rep, nil
}

// serveEcho serves a minimal echo upstream: the request line and headers as text, like
// sluice run's built-in echo, with no Proxy-Wasm host in front.
func serveEcho(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-serve: %v", err)
	}
	if err := loopback(host); err != nil {
		return fmt.Errorf("-serve: %v", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("sluice-load: echo on http://%s\n", ln.Addr())
	srv := &http.Server{Handler: http.HandlerFunc(echo), ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func echo(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	names := make([]string, 0, len(r.Header))
	for k := range r.Header {
		names = append(names, k)
	}
	sort.Strings(names)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s\nHost: %s\n", r.Method, r.URL.RequestURI(), r.Proto, r.Host)
	for _, k := range names {
		for _, v := range r.Header[k] {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	fmt.Fprintf(&b, "\n(%d body bytes)\n", n)
	io.WriteString(w, b.String())
}
