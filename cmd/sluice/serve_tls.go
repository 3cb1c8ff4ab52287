package main

// TLS for `sluice serve`: to the Redis Cluster (--redis-tls…, shared with
// `sluice run --redis-cluster`) and on the gRPC listener (--tls-cert,
// --tls-key, --tls-client-ca, --tls-client-san). Certificates and keys are
// read at start: a file that cannot be read or parsed stops the command
// there, naming the flag and the file. The listener's files are reloaded
// when they change (certReloader); the Redis side's take a restart.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// redisTLSFlags are the Redis TLS flags of `sluice serve` and `sluice run`
// (one definition for both). Their defaults come from envoyproxy/ratelimit's
// variables where it has one: REDIS_TLS, REDIS_TLS_CACERT,
// REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY,
// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION.
type redisTLSFlags struct {
	fs                        *flag.FlagSet
	on                        bool
	ca, cert, key, serverName string
	skipHostname, insecure    bool
	envErr                    map[string]error // by flag: a variable that is not a boolean
}

// redisTLSSubFlags are the flags that mean nothing without --redis-tls.
var redisTLSSubFlags = []string{"redis-tls-ca", "redis-tls-cert", "redis-tls-key", "redis-tls-server-name",
	"redis-tls-skip-hostname-verification", "redis-tls-insecure-skip-verify"}

// envBool reads a boolean environment variable ("" is false).
func envBool(name string) (bool, error) {
	v := os.Getenv(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("$%s=%q is not a boolean (true or false)", name, v)
	}
	return b, nil
}

func (f *redisTLSFlags) register(fs *flag.FlagSet) {
	f.fs = fs
	f.envErr = map[string]error{}
	boolEnv := func(flagName, env string) bool {
		b, err := envBool(env)
		if err != nil {
			f.envErr[flagName] = err
		}
		return b
	}
	fs.BoolVar(&f.on, "redis-tls", boolEnv("redis-tls", "REDIS_TLS"),
		"connect to every Redis node (seeds and the nodes they announce) over TLS ($REDIS_TLS)")
	fs.StringVar(&f.ca, "redis-tls-ca", os.Getenv("REDIS_TLS_CACERT"),
		"PEM file of the CA certificates the Redis nodes' certificates must chain to ($REDIS_TLS_CACERT; empty: the system's pool)")
	fs.StringVar(&f.cert, "redis-tls-cert", os.Getenv("REDIS_TLS_CLIENT_CERT"),
		"PEM file of a client certificate (chain) for nodes that require one, with --redis-tls-key ($REDIS_TLS_CLIENT_CERT)")
	fs.StringVar(&f.key, "redis-tls-key", os.Getenv("REDIS_TLS_CLIENT_KEY"),
		"PEM file of --redis-tls-cert's private key ($REDIS_TLS_CLIENT_KEY)")
	fs.StringVar(&f.serverName, "redis-tls-server-name", os.Getenv("SLUICE_REDIS_TLS_SERVER_NAME"),
		"name sent as SNI and verified in every node's certificate ($SLUICE_REDIS_TLS_SERVER_NAME; empty: the host dialled, an IP for the nodes a cluster announces)")
	fs.BoolVar(&f.skipHostname, "redis-tls-skip-hostname-verification", boolEnv("redis-tls-skip-hostname-verification", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"),
		"verify that the nodes' certificates chain to the CA, but not the name in them ($REDIS_TLS_SKIP_HOSTNAME_VERIFICATION)")
	fs.BoolVar(&f.insecure, "redis-tls-insecure-skip-verify", false,
		"verify no certificate at all (discouraged: anyone on the path can pose as Redis; logs a warning)")
}

// config returns the TLS configuration of the Redis connections (nil:
// cleartext) and what to warn about. A sub-flag given without --redis-tls is
// an error; their environment variables alone are ignored then, as
// envoyproxy/ratelimit ignores them without REDIS_TLS.
func (f *redisTLSFlags) config() (*tls.Config, []string, error) {
	set := map[string]bool{}
	if f.fs != nil { // nil: never registered (an embedder or a test that parsed no flags)
		f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	}
	for name, err := range f.envErr {
		if !set[name] && (f.on || name == "redis-tls") {
			return nil, nil, err
		}
	}
	if !f.on {
		for _, name := range redisTLSSubFlags {
			if set[name] {
				return nil, nil, fmt.Errorf("--%s needs --redis-tls", name)
			}
		}
		return nil, nil, nil
	}
	if (f.cert == "") != (f.key == "") {
		return nil, nil, errors.New("--redis-tls-cert and --redis-tls-key go together")
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.serverName}
	var warnings []string
	if f.ca != "" {
		pool, err := loadCAFile("--redis-tls-ca", f.ca)
		if err != nil {
			return nil, nil, err
		}
		c.RootCAs = pool
	}
	if f.cert != "" {
		kp, warn, err := loadKeyPair("--redis-tls-cert", f.cert, f.key)
		if err != nil {
			return nil, nil, err
		}
		c.Certificates = []tls.Certificate{kp}
		warnings = append(warnings, warn...)
	}
	switch {
	case f.insecure:
		c.InsecureSkipVerify = true
		warnings = append(warnings, "--redis-tls-insecure-skip-verify: the Redis nodes' certificates are not verified; anyone on the network path can pose as Redis and read the password")
	case f.skipHostname:
		// Go verifies the chain and the name together or not at all: the
		// chain is verified here instead, without a name.
		c.InsecureSkipVerify = true
		c.VerifyConnection = verifyChainOnly(c.RootCAs)
		warnings = append(warnings, "--redis-tls-skip-hostname-verification: the names in the Redis nodes' certificates are not verified (their chain is)")
	}
	return c, warnings, nil
}

// verifyChainOnly checks that the peer's certificate chains to roots (nil:
// the system's pool) for server authentication, whatever name it holds.
func verifyChainOnly(roots *x509.CertPool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tls: the Redis node sent no certificate")
		}
		opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
		for _, ic := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(ic)
		}
		if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
			return fmt.Errorf("tls: failed to verify certificate: %w", err)
		}
		return nil
	}
}

// loadCAFile reads a PEM bundle of CA certificates.
func loadCAFile(flagName, path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", flagName, path)
	}
	return pool, nil
}

// loadKeyPair reads a certificate (chain) and its key; a certificate out of
// its validity period is a warning (the peer will refuse it).
func loadKeyPair(flagName, certPath, keyPath string) (tls.Certificate, []string, error) {
	kp, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("%s %s with key %s: %w", flagName, certPath, keyPath, err)
	}
	var warnings []string
	if leaf := kp.Leaf; leaf != nil {
		if now := time.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
			warnings = append(warnings, fmt.Sprintf("%s %s is valid from %s to %s only", flagName, certPath,
				leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339)))
		}
	}
	return kp, warnings, nil
}

// grpcTLSFlags are the gRPC listener's TLS flags of `sluice serve`, their
// defaults envoyproxy/ratelimit's GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY
// and GRPC_CLIENT_TLS_CACERT when GRPC_SERVER_USE_TLS is true.
type grpcTLSFlags struct {
	cert, key, clientCA string
	clientSAN           string
	useEnv              bool
	envErr              error
	reloader            *certReloader // set by config
}

func (g *grpcTLSFlags) register(fs *flag.FlagSet) {
	g.useEnv, g.envErr = envBool("GRPC_SERVER_USE_TLS")
	env := func(name string) string {
		if g.useEnv {
			return os.Getenv(name)
		}
		return ""
	}
	fs.StringVar(&g.cert, "tls-cert", env("GRPC_SERVER_TLS_CERT"),
		"PEM file of the gRPC listener's certificate (chain), with --tls-key: serve TLS 1.2 or later instead of cleartext ($GRPC_SERVER_TLS_CERT if $GRPC_SERVER_USE_TLS is true)")
	fs.StringVar(&g.key, "tls-key", env("GRPC_SERVER_TLS_KEY"),
		"PEM file of --tls-cert's private key ($GRPC_SERVER_TLS_KEY)")
	fs.StringVar(&g.clientCA, "tls-client-ca", env("GRPC_CLIENT_TLS_CACERT"),
		"PEM file of CA certificates: every client must present a certificate that chains to one (mTLS) ($GRPC_CLIENT_TLS_CACERT)")
	fs.StringVar(&g.clientSAN, "tls-client-san", env("GRPC_CLIENT_TLS_SAN"),
		"with --tls-client-ca: comma-separated names, one of which a client certificate must carry as a DNS or URI subject alternative name ($GRPC_CLIENT_TLS_SAN)")
}

// config returns the listener's TLS configuration (nil: cleartext).
func (g *grpcTLSFlags) config() (*tls.Config, []string, error) {
	if g.envErr != nil {
		return nil, nil, g.envErr
	}
	if g.cert == "" && g.key == "" {
		switch {
		case g.clientCA != "":
			return nil, nil, errors.New("--tls-client-ca needs --tls-cert and --tls-key")
		case g.clientSAN != "":
			return nil, nil, errors.New("--tls-client-san needs --tls-cert, --tls-key and --tls-client-ca")
		case g.useEnv:
			return nil, nil, errors.New("$GRPC_SERVER_USE_TLS is true but neither --tls-cert nor $GRPC_SERVER_TLS_CERT is set")
		}
		return nil, nil, nil
	}
	if g.cert == "" || g.key == "" {
		return nil, nil, errors.New("--tls-cert and --tls-key go together")
	}
	if g.clientSAN != "" && g.clientCA == "" {
		return nil, nil, errors.New("--tls-client-san needs --tls-client-ca (a name is checked on a verified certificate)")
	}
	c, warnings, err := g.build()
	if err != nil {
		return nil, nil, err
	}
	r := &certReloader{flags: *g, current: c, stamp: g.stamp(), checked: time.Now()}
	outer := c.Clone()
	outer.GetConfigForClient = r.get
	g.reloader = r
	return outer, warnings, nil
}

// build reads the listener's files into a configuration.
func (g *grpcTLSFlags) build() (*tls.Config, []string, error) {
	kp, warnings, err := loadKeyPair("--tls-cert", g.cert, g.key)
	if err != nil {
		return nil, nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{kp}}
	if g.clientCA != "" {
		pool, err := loadCAFile("--tls-client-ca", g.clientCA)
		if err != nil {
			return nil, nil, err
		}
		c.ClientCAs = pool
		c.ClientAuth = tls.RequireAndVerifyClientCert
		if names := sanList(g.clientSAN); len(names) > 0 {
			c.VerifyConnection = requireSAN(names)
		}
	}
	return c, warnings, nil
}

func sanList(s string) []string {
	var out []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// requireSAN refuses a client certificate that carries none of names as a
// DNS or URI subject alternative name (exact match).
func requireSAN(names []string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("sluice serve: no client certificate")
		}
		leaf := cs.PeerCertificates[0]
		for _, n := range names {
			if slices.Contains(leaf.DNSNames, n) || slices.ContainsFunc(leaf.URIs, func(u *url.URL) bool { return u.String() == n }) {
				return nil
			}
		}
		return fmt.Errorf("sluice serve: the client certificate names none of --tls-client-san %s", strings.Join(names, ","))
	}
}

// stamp identifies the files' versions: their modification times and sizes
// (a Kubernetes secret's atomic symlink swap changes both).
func (g *grpcTLSFlags) stamp() string {
	var b []byte
	for _, p := range []string{g.cert, g.key, g.clientCA} {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			b = fmt.Appendf(b, "%d/%d;", fi.ModTime().UnixNano(), fi.Size())
		} else {
			b = append(b, "missing;"...)
		}
	}
	return string(b)
}

// certReloader serves the listener's certificate, key and client CAs as
// they are on disk: a handshake at least reloadCheck after the last check
// looks at the files, and a change is loaded. A change that does not load
// (a key that does not match its certificate yet, half of a rotation) keeps
// the previous configuration and is logged; the next change is tried again.
type certReloader struct {
	flags grpcTLSFlags

	mu      sync.Mutex
	current *tls.Config
	stamp   string
	checked time.Time
	logger  *slog.Logger
}

const reloadCheck = time.Second

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Config, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= reloadCheck {
		r.checked = now
		if st := r.flags.stamp(); st != r.stamp {
			r.stamp = st
			c, warnings, err := r.flags.build()
			switch {
			case err != nil:
				r.log(slog.LevelError, "sluice serve: the gRPC listener's TLS files changed but do not load; the previous ones stay", "err", err)
			default:
				r.current = c
				r.log(slog.LevelInfo, "sluice serve: the gRPC listener's TLS files reloaded", "cert", r.flags.cert)
				for _, w := range warnings {
					r.log(slog.LevelWarn, "sluice serve: "+w)
				}
			}
		}
	}
	return r.current, nil
}

func (r *certReloader) log(level slog.Level, msg string, args ...any) {
	if r.logger != nil {
		r.logger.Log(context.Background(), level, msg, args...)
	}
}

// serveTLS is the parsed TLS of `sluice serve`.
type serveTLS struct {
	redis    *tls.Config // nil: cleartext
	grpc     *tls.Config // nil: cleartext
	reloader *certReloader
	warnings []string
}

// serveTLSFlags registers and parses both sets of `sluice serve`.
type serveTLSFlags struct {
	redis redisTLSFlags
	grpc  grpcTLSFlags
}

func registerServeTLSFlags(fs *flag.FlagSet) *serveTLSFlags {
	f := &serveTLSFlags{}
	f.redis.register(fs)
	f.grpc.register(fs)
	return f
}

func (f *serveTLSFlags) parse() (serveTLS, error) {
	var t serveTLS
	var w1, w2 []string
	var err error
	if t.redis, w1, err = f.redis.config(); err != nil {
		return t, err
	}
	if t.grpc, w2, err = f.grpc.config(); err != nil {
		return t, err
	}
	t.reloader = f.grpc.reloader
	t.warnings = append(w1, w2...)
	return t, nil
}

// serverOptions are the gRPC server's options for the listener's TLS.
func (t serveTLS) serverOptions() []grpc.ServerOption {
	if t.grpc == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(t.grpc))}
}

// modes names the listener's and Redis's transport for the start-up line.
func (t serveTLS) modes() (grpcMode, redisMode string) {
	grpcMode, redisMode = "cleartext", "cleartext"
	if t.grpc != nil {
		grpcMode = "tls"
		if t.grpc.ClientAuth == tls.RequireAndVerifyClientCert {
			grpcMode = "mtls"
		}
	}
	if t.redis != nil {
		redisMode = "tls"
	}
	return grpcMode, redisMode
}

// check logs the warnings and, with TLS to Redis, whether every master
// answers through it: a certificate that does not verify is logged at start,
// in go-redis's and crypto/tls's words, rather than found in UNAVAILABLE
// answers. It does not stop the service (Redis may come up later).
func (t serveTLS) check(logger *slog.Logger, backend any) {
	for _, w := range t.warnings {
		logger.Warn("sluice serve: " + w)
	}
	if t.reloader != nil {
		t.reloader.mu.Lock()
		t.reloader.logger = logger
		t.reloader.mu.Unlock()
	}
	if t.redis == nil {
		return
	}
	p, ok := backend.(interface{ Ping() error })
	if !ok {
		return
	}
	if err := p.Ping(); err != nil {
		logger.Error("sluice serve: Redis over TLS does not answer yet; calls answer UNAVAILABLE until it does", "err", err)
	}
}
