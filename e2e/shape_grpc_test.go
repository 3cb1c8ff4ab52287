package e2e

import (
	"context"
	"net"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/filter"
)

// gRPC calls are held as HTTP requests are: 8 concurrent health checks of one tenant at
// 10/s (burst 1) with delay.max 500ms: 1 goes at once, 5 are held 100 ms apart (their
// response headers say for how long), 2 are refused at once with RESOURCE_EXHAUSTED.

const shapeGRPCConfig = `{"rules":[{"name":"health","match":{"path_prefix":"/grpc.health.v1.Health/"},
 "key":[{"header":"x-tenant"}],"algorithm":"leaky_bucket","limit":10,"window":"1s","burst":1,"delay":{"max":"500ms"}}]}`

// shapedGRPCServer is a health server that records when each call reaches it.
type shapedGRPCServer struct {
	port int
	mu   sync.Mutex
	at   []time.Time
}

func startShapedGRPCServer(t *testing.T) *shapedGRPCServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &shapedGRPCServer{port: ln.Addr().(*net.TCPAddr).Port}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		s.mu.Lock()
		s.at = append(s.at, time.Now())
		s.mu.Unlock()
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return s
}

func checkShapedGRPC(t *testing.T, hc healthpb.HealthClient, s *shapedGRPCServer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Warm the connection first, on another tenant.
	if _, err := hc.Check(tenant(ctx, "warm"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.at = nil
	s.mu.Unlock()
	type result struct {
		code  codes.Code
		delay string
		took  time.Duration
	}
	res := make([]result, 8)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var hdr metadata.MD
			t0 := time.Now()
			_, err := hc.Check(tenant(ctx, "shaped"), &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
			res[i] = result{status.Code(err), first(hdr.Get(filter.DelayHeader)), time.Since(t0)}
		}()
	}
	close(start)
	wg.Wait()
	var held []int
	ok, refused := 0, 0
	for _, r := range res {
		switch r.code {
		case codes.OK:
			ok++
			if r.delay != "" {
				ms, _ := strconv.Atoi(r.delay)
				held = append(held, ms)
			}
		case codes.ResourceExhausted:
			refused++
			if r.took > 300*time.Millisecond {
				t.Errorf("a refused call took %v: refusals are not held", r.took)
			}
		default:
			t.Errorf("call: %v", r.code)
		}
	}
	sort.Ints(held)
	if ok != 6 || refused != 2 || len(held) != 5 {
		t.Fatalf("%d OK (%d held: %v ms), %d RESOURCE_EXHAUSTED; want 6 (5 held), 2", ok, len(held), held, refused)
	}
	s.mu.Lock()
	at := append([]time.Time(nil), s.at...)
	s.mu.Unlock()
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	if len(at) != 6 {
		t.Fatalf("the server got %d calls, want 6", len(at))
	}
	for k := 1; k < len(at); k++ {
		slot := at[0].Add(time.Duration(k) * shapeSpacing)
		if at[k].Before(slot.Add(-shapeEarly)) || at[k].After(slot.Add(shapeLate)) {
			t.Errorf("call %d reached the server at +%v, its slot +%v", k, at[k].Sub(at[0]), slot.Sub(at[0]))
		}
	}
	t.Logf("held %v ms; the server saw the calls at %v", held, offsets(at))
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func offsets(at []time.Time) []time.Duration {
	out := make([]time.Duration, len(at))
	for i, a := range at {
		out[i] = a.Sub(at[0]).Round(time.Millisecond)
	}
	return out
}

// TestGRPCShapingThroughSluiceRun: through `sluice run --upstream h2c://…`.
func TestGRPCShapingThroughSluiceRun(t *testing.T) {
	s := startShapedGRPCServer(t)
	p := startGRPCProxy(t, shapeGRPCConfig, "127.0.0.1:"+strconv.Itoa(s.port))
	checkShapedGRPC(t, healthpb.NewHealthClient(grpcClient(t, p)), s)
	checkHostHealthy(t, p)
}

// TestEnvoyGRPCShaping: through real Envoy, an HTTP/2 cluster to the server.
func TestEnvoyGRPCShaping(t *testing.T) {
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		s := startShapedGRPCServer(t)
		e := startEnvoy(t, tg, envoyGRPCWorkers, func(site EnvoySite) ([]byte, error) {
			site.UpstreamPort = s.port
			return renderEnvoyGRPC(site, shapeGRPCConfig)
		})
		checkShapedGRPC(t, healthpb.NewHealthClient(grpcClient(t, envoyProxy(t, e))), s)
		checkEnvoyHealthy(t, e, envoyGRPCWorkers)
	})
}
