package integration

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/host"
)

// silentRedis is Higress's Redis extension for a host whose Redis never answers: the
// calls are accepted (a token is written, status OK) and proxy_on_redis_call_response
// never comes — the case the filter's guard exists for. Each accepted call's time is
// sent on calls.
type silentRedis struct {
	calls chan time.Time
	token atomic.Uint32
}

func (x *silentRedis) extension() host.Extension {
	i32 := api.ValueTypeI32
	return host.Extension{Name: "silent-redis", Funcs: []host.HostFunc{
		{Name: "proxy_redis_init", Params: []api.ValueType{i32, i32, i32, i32, i32, i32, i32}, Results: []api.ValueType{i32},
			Func: func(g *host.Guest, stack []uint64) { stack[0] = uint64(host.StatusOK) }},
		{Name: "proxy_redis_call", Params: []api.ValueType{i32, i32, i32, i32, i32}, Results: []api.ValueType{i32},
			Func: func(g *host.Guest, stack []uint64) {
				if !g.WriteUint32(uint32(stack[4]), x.token.Add(1)) {
					stack[0] = uint64(host.StatusInvalidMemoryAccess)
					return
				}
				select {
				case x.calls <- time.Now():
				default:
				}
				stack[0] = uint64(host.StatusOK)
			}},
	}}
}

type exchangeResult struct {
	resp *host.Response
	err  error
	at   time.Time
}

// In proxy-wasm-cpp-host a local reply raises a VM-wide stop-iteration flag that turns the
// status of whatever stream callback is running into StopAllIterationAndWatermark (the
// embedded host's default profile models it). So the guard must never answer a waiting
// request B from inside another request A's callback: A, which sluice lets through, would
// then hang until the stream idle timeout. B is answered from proxy_on_tick instead.
//
// Timeline (one worker, timeout_ms 1000: guard 1010 ms, tick period P = 1000 ms): B0's wait
// is failed by a tick at T; B is sent right after, so its deadline D lies between T+P and
// T+2P, and the next tick that can fail it comes at T+2P. A (no rule applies) is sent just
// after D, well before T+2P.
func TestRedisGuardDoesNotStopAnotherRequest(t *testing.T) {
	wasm := filtertest.Wasm(t, "redis")
	for _, c := range []struct {
		name, failure string
		status        int // B's answer: 503 (closed), or 429 (local: the fallback's one admission went to B0)
	}{{"closed", "closed", 503}, {"local", "local", 429}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const timeoutMS = 1000
			const guard = timeoutMS*time.Millisecond + 10*time.Millisecond
			cfg := fmt.Sprintf(`{"rules":[{"name":"r","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":1,"window":"1h","backend":"redis"}],
"failure_mode":%q,"redis":{"cluster":"silent","timeout_ms":%d}}`, c.failure, timeoutMS)
			x := &silentRedis{calls: make(chan time.Time, 4)}
			var logs bytes.Buffer
			var mu sync.Mutex
			h, err := host.New(context.Background(), host.Options{
				Wasm:         wasm,
				PluginConfig: []byte(cfg),
				Workers:      1,
				Logger:       slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)),
				Extensions:   []host.Extension{x.extension()},
			})
			if err != nil {
				t.Fatalf("host.New: %v\n%s", err, logs.String())
			}
			t.Cleanup(func() { h.Close(context.Background()) })
			send := func(timeout time.Duration, headers ...[2]string) <-chan exchangeResult {
				ch := make(chan exchangeResult, 1)
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					defer cancel()
					resp, err := h.Exchange(ctx, &host.Request{Method: "GET", Path: "/api", Headers: headers, RemoteAddr: "10.0.0.1:1234"}, upstream200)
					ch <- exchangeResult{resp, err, time.Now()}
				}()
				return ch
			}
			called := func(what string) time.Time {
				t.Helper()
				select {
				case at := <-x.calls:
					return at
				case <-time.After(5 * time.Second):
					t.Fatalf("%s made no Redis call\n%s", what, logs.String())
				}
				return time.Time{}
			}
			bound := guard + time.Second + 2*time.Second // guard, one tick period, slack
			user := [2]string{"x-user", "alice"}

			for attempt := 1; ; attempt++ {
				// B0 fixes the tick phase: its wait is failed by a tick.
				b0 := send(bound, user)
				called("B0")
				r0 := <-b0
				if r0.err != nil {
					t.Fatalf("B0: %v\n%s", r0.err, logs.String())
				}
				// B waits; A comes just after B's guard deadline.
				b := send(bound, user)
				sentB := called("B")
				time.Sleep(time.Until(sentB.Add(guard + 50*time.Millisecond)))
				sentA := time.Now()
				a := send(3 * time.Second) // no x-user: no rule applies, sluice lets it through
				var ra exchangeResult
				select {
				case ra = <-a:
				case <-time.After(5 * time.Second):
					t.Fatal("A: Exchange did not return")
				}
				if ra.err != nil || ra.resp.Status != 200 || ra.resp.Local {
					stateB := "still waiting"
					select {
					case rb := <-b:
						stateB = fmt.Sprintf("answered %d %v after A was sent", rb.resp.Status, rb.at.Sub(sentA))
					default:
					}
					t.Fatalf("A (no rule applies, sent after B's guard deadline) did not pass: %+v, error %v, %v after it was sent; B %s.\n"+
						"A local reply for B sent during A's callback stops A (cpp-host's VM-wide stop-iteration flag).\n%s",
						ra.resp, ra.err, ra.at.Sub(sentA), stateB, logs.String())
				}
				select {
				case rb := <-b:
					if !rb.at.Before(sentA) {
						// Even where a host does not stop A (the permissive profile), B must
						// not be answered from A's callback.
						t.Fatalf("B answered %d %v after A was sent, %v before A's answer: from A's callback, not by the tick",
							rb.resp.Status, rb.at.Sub(sentA), ra.at.Sub(rb.at))
					}
					// A tick failed B before A arrived (the tick phase was not where this
					// test put it, e.g. on a loaded machine): the case was not exercised.
					if attempt == 3 {
						t.Fatalf("B was answered before A ran in all %d attempts (%+v): could not exercise the case", attempt, rb.resp)
					}
					t.Logf("attempt %d: B answered %d %v after its call, A sent %v and answered %v after it; again",
						attempt, rb.resp.Status, rb.at.Sub(sentB), sentA.Sub(sentB), ra.at.Sub(sentB))
					continue
				default:
				}
				// B is still waiting: the next tick fails it.
				rb := <-b
				if rb.err != nil || rb.resp.Status != c.status {
					t.Fatalf("B: %+v, error %v; want %d from the guard", rb.resp, rb.err, c.status)
				}
				// The status and the timeouts metric say the guard answered B; the bound only
				// that it did so at the next tick, with bound's 2 s of slack for a loaded machine.
				if waited := rb.at.Sub(sentB); waited > bound {
					t.Errorf("B waited %v: more than the guard (%v), one tick period and 2 s", waited, guard)
				}
				if m, _ := h.Metric(filter.MetricRedisTimeouts); m.Value != int64(2*attempt) {
					t.Errorf("%s = %v, want %d", filter.MetricRedisTimeouts, m.Value, 2*attempt)
				}
				t.Logf("A passed %v after B's guard deadline; B answered %d by the tick %v after its call",
					ra.at.Sub(sentB.Add(guard)), rb.resp.Status, rb.at.Sub(sentB))
				return
			}
		})
	}
}
