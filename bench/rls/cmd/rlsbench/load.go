package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// client is a fixed set of gRPC connections to one rate-limit service.
type client struct {
	conns []*grpc.ClientConn
	rls   []rlsv3.RateLimitServiceClient
}

// dial opens n HTTP/2 connections to addr (a loopback address). Envoy holds
// one connection per worker thread to a rate-limit cluster; a few
// connections model a few workers.
func dial(addr string, n int) (*client, error) {
	c := &client{}
	for i := 0; i < n; i++ {
		// grpc.WithNoProxy: loopback only, never through an environment proxy.
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithNoProxy())
		if err != nil {
			c.close()
			return nil, err
		}
		cc.Connect()
		c.conns = append(c.conns, cc)
		c.rls = append(c.rls, rlsv3.NewRateLimitServiceClient(cc))
	}
	return c, nil
}

func (c *client) close() {
	for _, cc := range c.conns {
		cc.Close()
	}
}

// request is one decision on descriptor key=value of domain.
func request(domain, key, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{
		Domain: domain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
		}},
		HitsAddend: 1,
	}
}

// load is one measured run: a closed loop of concurrency callers on the
// client's connections, each call one descriptor key=<prefix><i> with i
// cycling over keys values.
type load struct {
	domain, key, prefix string
	keys                int
	concurrency         int
	warmup, duration    time.Duration
	timeout             time.Duration // per call
}

// result is what one run measured.
type result struct {
	ok, over, errs int64
	elapsed        time.Duration
	lat            []time.Duration // sorted, measured calls only
	firstErr       error
}

func (r *result) decisions() int64 { return r.ok + r.over }

func (r *result) perSecond() float64 { return float64(r.decisions()) / r.elapsed.Seconds() }

// run drives the load: warm-up calls are made and discarded, then every call
// that starts in [start, start+duration) is counted. onMeasure is called
// when the measured span starts and ends (to read CPU counters); every
// caller has finished its last call when run returns.
func (l load) run(c *client, onMeasure func(start bool)) *result {
	var phase atomic.Int32 // 0 warm-up, 1 measuring, 2 done
	var next atomic.Int64
	type part struct {
		ok, over, errs int64
		lat            []time.Duration
		err            error
	}
	parts := make([]part, l.concurrency)
	var wg sync.WaitGroup
	for g := 0; g < l.concurrency; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			p := &parts[g]
			rls := c.rls[g%len(c.rls)]
			for {
				ph := phase.Load()
				if ph == 2 {
					return
				}
				i := next.Add(1)
				req := request(l.domain, l.key, l.prefix+strconv.FormatInt(i%int64(l.keys), 10))
				ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
				t0 := time.Now()
				resp, err := rls.ShouldRateLimit(ctx, req)
				d := time.Since(t0)
				cancel()
				if ph != 1 {
					continue
				}
				switch {
				case err != nil:
					p.errs++
					if p.err == nil {
						p.err = err
					}
					continue
				case len(resp.GetStatuses()) != 1:
					p.errs++
					if p.err == nil {
						p.err = fmt.Errorf("%d statuses for one descriptor", len(resp.GetStatuses()))
					}
					continue
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
					p.ok++
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
					p.over++
				default:
					p.errs++
					if p.err == nil {
						p.err = errors.New("overall_code " + resp.GetOverallCode().String())
					}
					continue
				}
				p.lat = append(p.lat, d)
			}
		}(g)
	}
	time.Sleep(l.warmup) // a fixed warm-up span, not a wait for a condition
	onMeasure(true)
	start := time.Now()
	phase.Store(1)
	time.Sleep(l.duration) // the measured span
	phase.Store(2)
	elapsed := time.Since(start)
	wg.Wait()
	onMeasure(false)
	r := &result{elapsed: elapsed}
	for _, p := range parts {
		r.ok += p.ok
		r.over += p.over
		r.errs += p.errs
		r.lat = append(r.lat, p.lat...)
		if r.firstErr == nil {
			r.firstErr = p.err
		}
	}
	slices.Sort(r.lat)
	return r
}

// exact fires n concurrent calls on one fresh descriptor value and returns
// how many were admitted (OK), or the first error.
func exact(c *client, domain, key, value string, n int, timeout time.Duration) (int, error) {
	var ok atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			resp, err := c.rls[i%len(c.rls)].ShouldRateLimit(ctx, request(domain, key, value))
			if err == nil && len(resp.GetStatuses()) != 1 {
				err = fmt.Errorf("%d statuses for one descriptor", len(resp.GetStatuses()))
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok.Add(1)
			}
		}(i)
	}
	close(start)
	wg.Wait()
	return int(ok.Load()), firstErr
}

// ready polls until the service answers a call on key with a status that
// names a limit (its configuration is loaded), or the deadline passes.
func ready(c *client, domain, key string, deadline time.Time) error {
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := c.rls[0].ShouldRateLimit(ctx, request(domain, key, "ready"))
		cancel()
		if err == nil && len(resp.GetStatuses()) == 1 && resp.GetStatuses()[0].GetCurrentLimit() != nil {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("no limit in the answer (configuration not loaded?): %v", resp)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not ready: %w", last)
}
