package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestScenarios runs every scenario against `sluice run` (see target_test.go), one proxy
// per scenario; TestEnvoyScenarios runs them through real Envoy.
func TestScenarios(t *testing.T) {
	for _, sc := range Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			if sc.StartFails != nil {
				runStartFailure(t, sc)
				return
			}
			p := startHost(t, sc)
			runSteps(t, p, sc.Steps)
			checkHostHealthy(t, p)
		})
	}
}

// TestScenarioList keeps the scenario list well-formed: unique names usable as file and
// test names, valid configurations for the ones that must start, and no step without an
// expectation.
func TestScenarioList(t *testing.T) {
	seen := map[string]bool{}
	algs := map[string]bool{}
	for _, sc := range Scenarios() {
		if seen[sc.Name] || sc.Name == "" || strings.ContainsAny(sc.Name, " /\\$^*") {
			t.Errorf("scenario name %q: empty, duplicate or not usable in -run", sc.Name)
		}
		seen[sc.Name] = true
		if (sc.StartFails == nil) == (len(sc.Steps) == 0) {
			t.Errorf("%s: want either steps or a start failure", sc.Name)
		}
		for i, st := range sc.Steps {
			if st.Want.Status == 0 {
				t.Errorf("%s: step %d (%s) has no expected status", sc.Name, i, st.Desc)
			}
			if st.Burst != nil && (st.Burst.N < 1 || st.Burst.Admitted > st.Burst.N || st.Poll != 0 || st.Times != 0) {
				t.Errorf("%s: step %d (%s): malformed burst", sc.Name, i, st.Desc)
			}
		}
		for _, a := range Algorithms {
			if strings.Contains(sc.Config, `"`+a+`"`) {
				algs[a] = true
			}
		}
	}
	for _, a := range Algorithms {
		if !seen["limit-"+a] || !algs[a] {
			t.Errorf("no limit-reached-and-recovered scenario for %s", a)
		}
	}
}

// client returns an HTTP client for one scenario: keep-alive, bounded per request.
func newClient(conns int) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        conns + 8,
		MaxIdleConnsPerHost: conns + 8,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// h2cClient is the client of Request.HTTP2: HTTP/2 cleartext with prior knowledge, one
// connection per proxy address, shared by the scenarios.
var h2cClient = sync.OnceValue(func() *http.Client {
	tr := &http.Transport{Proxy: nil, DisableCompression: true, Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
})

type response struct {
	status int
	header http.Header
	body   []byte
}

func do(ctx context.Context, c *http.Client, base string, r Request) (response, error) {
	method, path := r.Method, r.Path
	if method == "" {
		method = http.MethodGet
	}
	if path == "" {
		path = "/"
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
	if err != nil {
		return response{}, err
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if h := r.Header.Get("Host"); h != "" {
		req.Host = h // net/http sends req.Host, not a Host header
	}
	if r.HTTP2 {
		c = h2cClient()
	}
	resp, err := c.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	if r.HTTP2 && resp.ProtoMajor != 2 {
		return response{}, fmt.Errorf("an HTTP/2 request answered over %s", resp.Proto)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return response{}, err
	}
	return response{resp.StatusCode, resp.Header, body}, nil
}

func describe(r Request) string {
	m := r.Method
	if m == "" {
		m = "GET"
	}
	var h []string
	for k, vs := range r.Header {
		h = append(h, k+": "+strings.Join(vs, ","))
	}
	slices.Sort(h)
	if len(h) == 0 {
		return m + " " + r.Path
	}
	return fmt.Sprintf("%s %s [%s]", m, r.Path, strings.Join(h, "; "))
}

// runSteps runs the steps in order against p; the first failing step ends the scenario
// (later steps depend on the state it should have left).
func runSteps(t *testing.T, p *proxy, steps []Step) {
	t.Helper()
	c := newClient(4)
	defer c.CloseIdleConnections()
	ctx := context.Background()
	for i, st := range steps {
		where := fmt.Sprintf("step %d (%s) %s", i, st.Desc, describe(st.Req))
		switch {
		case st.Burst != nil:
			if err := runBurst(ctx, p, st); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
		case st.Flood != nil:
			if err := runFlood(ctx, t, p, st); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
		case st.Poll > 0:
			deadline := time.Now().Add(st.Poll)
			n := 0
			for {
				r, err := do(ctx, c, p.url, st.Req)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				n++
				verr := st.Want.Verify(r.status, r.header, r.body)
				if verr == nil {
					break
				}
				if !slices.Contains(st.PollWhile, r.status) {
					t.Fatalf("%s: response %d: %v (only %v may come before it)", where, n, verr, st.PollWhile)
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: no matching response within %v (%d tries); last: %v", where, st.Poll, n, verr)
				}
				time.Sleep(50 * time.Millisecond)
			}
		default:
			times := max(st.Times, 1)
			for n := 1; n <= times; n++ {
				r, err := do(ctx, c, p.url, st.Req)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				if err := st.Want.Verify(r.status, r.header, r.body); err != nil {
					t.Fatalf("%s: response %d of %d: %v", where, n, times, err)
				}
			}
		}
	}
}

// maxDials bounds concurrent connection attempts, so that opening thousands of
// connections does not overflow the listener's accept backlog.
const maxDials = 128

// runBurst opens st.Burst.N connections, then sends N copies of st.Req at once and checks
// that exactly Admitted got st.Want.Status and the rest DeniedStatus.
func runBurst(ctx context.Context, p *proxy, st Step) error {
	b := st.Burst
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c := newClient(b.N)
	dials := make(chan struct{}, maxDials)
	d := &net.Dialer{Timeout: 10 * time.Second}
	c.Transport.(*http.Transport).DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		select {
		case dials <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		defer func() { <-dials }()
		return d.DialContext(ctx, network, addr)
	}
	defer c.CloseIdleConnections()

	// Open N connections: N concurrent requests that no rule applies to.
	errs := make(chan error, b.N)
	var wg sync.WaitGroup
	for range b.N {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := do(ctx, c, p.url, Request{Path: "/e2e-warm"})
			if err == nil && r.status != http.StatusOK {
				err = fmt.Errorf("warm-up request: status %d, want 200", r.status)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}

	// All at once.
	start := make(chan struct{})
	statuses := make(chan int, b.N)
	for range b.N {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := do(ctx, c, p.url, st.Req)
			if err != nil {
				errs <- err
				return
			}
			statuses <- r.status
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(began)
	close(statuses)
	select {
	case err := <-errs:
		return err
	default:
	}
	counts := map[int]int{}
	for s := range statuses {
		counts[s]++
	}
	if counts[st.Want.Status] != b.Admitted || counts[b.DeniedStatus] != b.N-b.Admitted || len(counts) > 2 {
		return fmt.Errorf("statuses %v of %d concurrent requests (in %v), want exactly %d × %d and %d × %d",
			counts, b.N, elapsed, b.Admitted, st.Want.Status, b.N-b.Admitted, b.DeniedStatus)
	}
	return nil
}
