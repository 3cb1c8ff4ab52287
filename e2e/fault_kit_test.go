package e2e

import (
	"context"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// The fault kit of the network-failure suite (fault_test.go): an in-process toxiproxy link
// between the Envoys and `sluice serve`, and the measurements the suite asserts.

// faultLink is one toxiproxy proxy on 127.0.0.1: Envoy's cluster "rls" points at its port.
type faultLink struct {
	t    *testing.T
	p    *toxiproxy.Proxy
	port int
}

// newFaultLink proxies a free loopback port to upstream until the test ends.
func newFaultLink(t *testing.T, upstream string) *faultLink {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "rls", addr, upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	port, _ := strconv.Atoi(addr[strings.LastIndexByte(addr, ':')+1:])
	return &faultLink{t: t, p: p, port: port}
}

// toxic adds a toxic on the streams named ("upstream": to the service, "downstream": back)
// of the link (a JSON toxic: type and attributes).
func (f *faultLink) toxic(name, typ, attrs string, streams ...string) {
	f.t.Helper()
	for _, stream := range streams {
		js := `{"name":"` + name + "-" + stream + `","type":"` + typ + `","stream":"` + stream + `","toxicity":1,"attributes":` + attrs + `}`
		if _, err := f.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			f.t.Fatalf("toxic %s: %v", name, err)
		}
	}
}

// heal removes every toxic and (re)opens the listener.
func (f *faultLink) heal() {
	f.t.Helper()
	f.p.Toxics.ResetToxics(context.Background())
	if !f.p.Enabled {
		if err := f.p.Start(); err != nil {
			f.t.Fatalf("reopening the link: %v", err)
		}
	}
}

// refuse closes the link's listener and its connections: new connections are refused.
func (f *faultLink) refuse() { f.p.Stop() }

// timed is one request's status and duration.
type timed struct {
	status int
	d      time.Duration
}

// timedGets sends n GETs with x-api-key: key, one at a time, alternating over urls.
func timedGets(t *testing.T, urls []string, n int, key string) []timed {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	out := make([]timed, n)
	for i := range out {
		req, _ := http.NewRequest("GET", urls[i%len(urls)]+"/items", nil)
		req.Header.Set("x-api-key", key)
		begin := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
		out[i] = timed{resp.StatusCode, time.Since(begin)}
	}
	return out
}

// statuses counts answers by status.
func statuses(ts []timed) map[int]int {
	m := map[int]int{}
	for _, x := range ts {
		m[x.status]++
	}
	return m
}

// p99 is the 99th percentile (the largest, for fewer than 100) of the durations.
func p99(ts []timed) time.Duration {
	ds := make([]time.Duration, len(ts))
	for i, x := range ts {
		ds[i] = x.d
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[min(len(ds)-1, len(ds)*99/100)]
}

// faultPoll polls cond every 20 ms until it holds (the time it took) or timeout passes.
func faultPoll(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	begin := time.Now()
	for !cond() {
		if time.Since(begin) > timeout {
			t.Fatalf("not within %v: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(begin)
}
