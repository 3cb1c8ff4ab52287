package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"text/template"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// rlqsBootstrapTmpl is an Envoy with the rate_limit_quota filter in front of a
// direct_response route: requests with x-api-key fall into the bucket
// {api: <x-api-key>} of Domain, reported every second to the cluster "rlqs"
// (the `sluice serve` replicas of Ports, round robin, HTTP/2 cleartext).
var rlqsBootstrapTmpl = template.Must(template.New("rlqs").Parse(`
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 0}}
static_resources:
  listeners:
  - name: ingress
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress_http
          route_config:
            name: local_route
            virtual_hosts:
            - name: backend
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                direct_response: {status: 200, body: {inline_string: "ok"}}
          http_filters:
          - name: envoy.filters.http.rate_limit_quota
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
              rlqs_server:
                envoy_grpc: {cluster_name: rlqs}
{{- if .Client}}
                initial_metadata: [{key: x-sluice-client-id, value: "{{.Client}}"}]
{{- end}}
              domain: {{.Domain}}
              bucket_matchers:
                matcher_list:
                  matchers:
                  - predicate:
                      single_predicate:
                        input:
                          name: api
                          typed_config:
                            "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                            header_name: x-api-key
                        value_match: {safe_regex: {google_re2: {}, regex: ".+"}}
                    on_match:
                      action:
                        name: rate_limit_quota
                        typed_config:
                          "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                          bucket_id_builder:
                            bucket_id_builder:
                              api:
                                custom_value:
                                  name: api
                                  typed_config:
                                    "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                    header_name: x-api-key
                          reporting_interval: 1s
                          no_assignment_behavior:
                            fallback_rate_limit: {blanket_rule: {{.NoAssignment}}}
{{- if .Expired}}
                          expired_assignment_behavior:
                            expired_assignment_behavior_timeout: {{.ExpiredTimeout}}
                            fallback_rate_limit: {blanket_rule: {{.Expired}}}
{{- end}}
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: rlqs
    type: STATIC
    connect_timeout: 0.5s
    lb_policy: ROUND_ROBIN
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment:
      cluster_name: rlqs
      endpoints:
      - lb_endpoints:
{{- range .Ports}}
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: {{.}}}}}
{{- end}}
`))

type rlqsBootstrap struct {
	Domain       string
	NoAssignment string // ALLOW_ALL or DENY_ALL
	Ports        []int
	// Expired, when set (ALLOW_ALL or DENY_ALL), is the buckets'
	// expired_assignment_behavior fallback_rate_limit, in force for
	// ExpiredTimeout (a duration, "6s") after an assignment's TTL.
	Expired, ExpiredTimeout string
	Client                  string // x-sluice-client-id ("" for none)
}

func renderRLQSEnvoy(b rlqsBootstrap) func(EnvoySite) ([]byte, error) {
	return func(EnvoySite) ([]byte, error) {
		var out bytes.Buffer
		err := rlqsBootstrapTmpl.Execute(&out, b)
		return out.Bytes(), err
	}
}

// startRLQSEnvoy starts one Envoy (one worker, no Wasm) with the filter and
// returns it with its ingress URL. It does not take one of envoyParallel's
// slots: a test here runs five such Envoys at once, each light.
func startRLQSEnvoy(t *testing.T, tg envoyproc.Target, b rlqsBootstrap) (*envoyproc.Envoy, string) {
	t.Helper()
	y, err := renderRLQSEnvoy(b)(EnvoySite{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := envoyproc.Start(context.Background(), tg, envoyproc.Options{Bootstrap: y, Concurrency: 1, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Stop()
		if t.Failed() {
			t.Logf("envoy %s log:\n%s", tg.Version, boundedLog(e.Log()))
		}
	})
	return e, envoyProxy(t, e).url
}

// rlqsLoad sends requests with x-api-key: key to url from conc goroutines,
// each pausing gap between requests, until stopped; it counts the answers.
type rlqsLoad struct {
	ok, denied, other atomic.Int64
	stop              chan struct{}
	wg                sync.WaitGroup
}

func startRLQSLoad(url, key string, conc int, gap time.Duration) *rlqsLoad {
	l := &rlqsLoad{stop: make(chan struct{})}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
	for range conc {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				req, _ := http.NewRequestWithContext(context.Background(), "GET", url+"/", nil)
				req.Header.Set("x-api-key", key)
				resp, err := client.Do(req)
				switch {
				case err != nil:
					l.other.Add(1)
					time.Sleep(10 * time.Millisecond)
				default:
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					switch resp.StatusCode {
					case 200:
						l.ok.Add(1)
					case 429:
						l.denied.Add(1)
					default:
						l.other.Add(1)
					}
				}
				if gap > 0 {
					select {
					case <-l.stop:
						return
					case <-time.After(gap):
					}
				}
			}
		}()
	}
	return l
}

// end stops the load and waits for the requests in flight.
func (l *rlqsLoad) end() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

func (l *rlqsLoad) String() string {
	return fmt.Sprintf("%d admitted, %d denied, %d other", l.ok.Load(), l.denied.Load(), l.other.Load())
}

// rlqsGet sends one request with x-api-key: key and returns its status.
func rlqsGet(t *testing.T, url, key string) int {
	t.Helper()
	return getStatus(t, url+"/", "x-api-key", key)
}
