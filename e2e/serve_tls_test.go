package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// rlsTLSSocket is the transport_socket of the cluster "rls" for `sluice serve
// --tls-cert --tls-key --tls-client-ca`: Envoy presents a client certificate,
// and verifies the service's against the CA and the name rls.sluice.test.
// No alpn_protocols: on a cluster with http2_protocol_options Envoy offers
// h2 by itself, which the service (grpc-go) requires of TLS clients. Without
// the client certificate (client false) the service refuses the handshake.
func rlsTLSSocket(certs *redistest.Certs, client bool) string {
	var s strings.Builder
	s.WriteString(`    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: ` + certs.ServerName + `
        common_tls_context:
`)
	if client {
		s.WriteString(`          tls_certificates:
          - certificate_chain: {filename: ` + certs.ClientCertFile + `}
            private_key: {filename: ` + certs.ClientKeyFile + `}
`)
	}
	s.WriteString(`          validation_context:
            trusted_ca: {filename: ` + certs.CAFile + `}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {exact: ` + certs.ServerName + `}
`)
	return s.String()
}

// renderRLSEnvoyTLS renders envoy/rls.yaml.tmpl with the cluster "rls"
// speaking TLS (rlsTLSSocket).
func renderRLSEnvoyTLS(b rlsBootstrap, socket string) func(EnvoySite) ([]byte, error) {
	render := renderRLSEnvoy(b)
	return func(site EnvoySite) ([]byte, error) {
		y, err := render(site)
		if err != nil {
			return nil, err
		}
		const at = "  - name: rls\n    type: STATIC\n"
		if strings.Count(string(y), at) != 1 {
			return nil, errors.New("envoy/rls.yaml.tmpl: no single cluster \"rls\" to give a transport_socket")
		}
		return []byte(strings.Replace(string(y), at, at+socket, 1)), nil
	}
}

// TestEnvoyRateLimitFilterMTLS: stock Envoy's envoy.filters.http.ratelimit
// reaches `sluice serve` over mTLS (the cluster's transport_socket with a
// client certificate; the service with --tls-client-ca), and the service
// decides on a Redis Cluster that speaks TLS only and requires client
// certificates (--redis-tls…): a limit of 5 admits 5 requests, then 429.
// An Envoy without the client certificate is refused by the service:
// with failure_mode_deny its requests answer 500, counted as ratelimit errors.
func TestEnvoyRateLimitFilterMTLS(t *testing.T) {
	skipShort(t, "runs real Envoy and sluice serve over TLS")
	c, certs := redistest.StartTLSTest(t, "rls.sluice.test")
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		domain := rlsName(tg, "mtls")
		cfgPath := filepath.Join(t.TempDir(), "ratelimit.yaml")
		cfg := "domain: " + domain + "\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: year\n      requests_per_unit: 5\n"
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		srv := startServe(t, c, "--config", cfgPath,
			"--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile, "--tls-client-ca", certs.CAFile,
			"--redis-tls", "--redis-tls-ca", certs.CAFile, "--redis-tls-cert", certs.ClientCertFile, "--redis-tls-key", certs.ClientKeyFile)
		if log := srv.log.String(); !strings.Contains(log, "grpc_transport=mtls redis_transport=tls") || strings.Contains(log, "level=ERROR") {
			t.Fatalf("sluice serve's start:\n%s", log)
		}
		filter := &rateLimitFilter{Domain: domain, FailureModeDeny: true}

		e := startEnvoy(t, tg, 2, renderRLSEnvoyTLS(rlsBootstrap{Name: "ratelimit filter over mTLS", RLSPort: srv.port, RateLimit: filter},
			rlsTLSSocket(certs, true)))
		url := envoyProxy(t, e).url
		var got []int
		for range 8 {
			got = append(got, rlsGet(t, url, "k").status)
		}
		want := []int{200, 200, 200, 200, 200, 429, 429, 429}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("statuses %v, want %v", got, want)
			}
		}
		ok, over, errs := envoyStat(t, e, "cluster.upstream.ratelimit.ok"), envoyStat(t, e, "cluster.upstream.ratelimit.over_limit"),
			envoyStat(t, e, "cluster.upstream.ratelimit.error")
		handshakes := envoyStat(t, e, "cluster.rls.ssl.handshake")
		t.Logf("envoy %s over mTLS: statuses %v; ratelimit ok %d, over_limit %d, error %d; cluster.rls.ssl.handshake %d", tg.Version, got, ok, over, errs, handshakes)
		if ok != 5 || over != 3 || errs != 0 || handshakes < 1 {
			t.Errorf("ratelimit stats ok %d, over_limit %d, error %d, rls TLS handshakes %d; want 5, 3, 0, at least 1", ok, over, errs, handshakes)
		}

		bare := startEnvoy(t, tg, 1, renderRLSEnvoyTLS(rlsBootstrap{Name: "ratelimit filter, TLS without a client certificate", RLSPort: srv.port, RateLimit: filter},
			rlsTLSSocket(certs, false)))
		if a := rlsGet(t, envoyProxy(t, bare).url, "k2"); a.status != 500 {
			t.Errorf("without a client certificate: status %d, want 500 (failure_mode_deny)", a.status)
		}
		if n := envoyStat(t, bare, "cluster.upstream.ratelimit.error"); n != 1 {
			t.Errorf("without a client certificate: ratelimit.error %d, want 1", n)
		}
	})
}
