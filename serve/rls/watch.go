package rls

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-proxy/sluice/internal/resp"
)

// Watch is a Backend that watches the Redis calls through it: it logs Redis
// error replies (OOM, NOAUTH, CLUSTERDOWN, …) and calls that got no reply,
// rate-limited, with the error and the node; it counts them by kind; and it
// says whether the service can decide (Ready): not while every Redis call of
// the last FailFor failed, again at the first call that succeeds. While no
// call succeeds, a probe (a write of one short-lived key) runs every
// ProbeEvery, so that readiness comes back with Redis even when no traffic
// arrives (an orchestrator sends none to a replica that is not ready).
type Watch struct {
	b        Backend
	node     func(cmd []byte) string // the node a command goes to ("": unknown)
	log      *slog.Logger
	onChange func(ready bool, why string)
	now      func() time.Time

	// FailFor is how long Redis calls must all fail before the service is
	// not ready; ProbeEvery how often the probe runs while no call succeeds;
	// LogEvery the least time between two log lines of one kind and node.
	FailFor, ProbeEvery, LogEvery, ProbeTimeout time.Duration

	mu          sync.Mutex
	failingFrom time.Time // the first failure since the last success (zero: none)
	lastWhy     string
	failing     atomic.Bool  // failingFrom is set
	lastOK      atomic.Int64 // Unix ns of the last success
	logged      map[string]watchLog
	ready       atomic.Bool

	ok, errorReplies, timeouts, noReply atomic.Uint64
	stop                                chan struct{}
	stopOnce                            sync.Once
}

type watchLog struct {
	at         time.Time
	suppressed int
}

// NewWatch watches b. node names the node of a command for the log (nil:
// none); onChange, if set, is called when readiness changes (Ready's value
// and why), outside any lock of the Watch. Call Start to run the probe.
func NewWatch(b Backend, node func(cmd []byte) string, logger *slog.Logger, onChange func(ready bool, why string)) *Watch {
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	w := &Watch{b: b, node: node, log: logger, onChange: onChange, now: time.Now,
		FailFor: time.Second, ProbeEvery: 500 * time.Millisecond, LogEvery: 10 * time.Second, ProbeTimeout: time.Second,
		logged: map[string]watchLog{}, stop: make(chan struct{})}
	w.ready.Store(true)
	return w
}

// Ready reports whether the service can decide: some Redis call succeeded
// within FailFor of the last failure.
func (w *Watch) Ready() bool { return w.ready.Load() }

// Do implements Backend.
func (w *Watch) Do(ctx context.Context, cmd []byte) ([]byte, error) {
	reply, err := w.b.Do(ctx, cmd)
	w.observe(cmd, reply, err)
	return reply, err
}

// DoPipeline implements Pipeliner.
func (w *Watch) DoPipeline(ctx context.Context, cmds [][]byte) ([][]byte, []error) {
	replies, errs := doPipeline(ctx, w.b, cmds)
	for i := range cmds {
		w.observe(cmds[i], replies[i], errs[i])
	}
	return replies, errs
}

// observe classifies one call's outcome.
func (w *Watch) observe(cmd, reply []byte, err error) {
	switch {
	case err != nil:
		kind := "no reply"
		if isTimeoutErr(err) {
			w.timeouts.Add(1)
			kind = "timeout"
		} else {
			w.noReply.Add(1)
		}
		w.failed(kind, err.Error(), cmd)
	case len(reply) > 2 && reply[0] == '-':
		msg := strings.TrimRight(string(reply[1:]), "\r\n")
		if resp.Classify([]byte(msg)) == resp.CodeNoScript {
			w.succeeded() // the node answers; EVAL follows
			return
		}
		w.errorReplies.Add(1)
		w.failed("error reply", msg, cmd)
	default:
		w.succeeded()
	}
}

// isTimeoutErr reports whether err is a call that ended at its deadline.
func isTimeoutErr(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || strings.HasSuffix(err.Error(), "timeout")
}

func (w *Watch) succeeded() {
	w.ok.Add(1)
	w.lastOK.Store(w.now().UnixNano())
	if !w.failing.Load() && w.ready.Load() {
		return // the common case: no lock
	}
	w.mu.Lock()
	w.failingFrom = time.Time{}
	w.failing.Store(false)
	changed := !w.ready.Swap(true)
	w.mu.Unlock()
	if changed {
		w.log.Info("sluice serve: ready: Redis decides again")
		if w.onChange != nil {
			w.onChange(true, "")
		}
	}
}

// failed records a failed call (kind, the error, its command) and logs it,
// at most once per LogEvery for one kind, error code and node.
func (w *Watch) failed(kind, msg string, cmd []byte) {
	node := ""
	if w.node != nil && cmd != nil {
		node = w.node(cmd)
	}
	now := w.now()
	w.mu.Lock()
	if !w.failing.Load() {
		w.failingFrom = now
		w.failing.Store(true)
	}
	w.lastWhy = kind + ": " + msg
	key := kind + "|" + firstWord(msg) + "|" + node
	l, seen := w.logged[key]
	logIt := !seen || now.Sub(l.at) >= w.LogEvery
	if logIt {
		w.logged[key] = watchLog{at: now}
	} else {
		l.suppressed++
		w.logged[key] = l
	}
	if len(w.logged) > 256 { // bounded whatever the errors: forget the old lines
		clear(w.logged)
	}
	w.mu.Unlock()
	if logIt {
		w.log.Warn("sluice serve: Redis call failed", "kind", kind, "error", msg, "node", node, "suppressed_since_last", l.suppressed)
	}
	w.check(now)
}

// check makes the service not ready once calls have failed for FailFor
// with none succeeding.
func (w *Watch) check(now time.Time) {
	w.mu.Lock()
	down := w.failing.Load() && now.Sub(w.failingFrom) >= w.FailFor && w.lastOK.Load() <= w.failingFrom.UnixNano()
	why := w.lastWhy
	changed := down && w.ready.Swap(false)
	w.mu.Unlock()
	if changed {
		w.log.Error("sluice serve: not ready: Redis cannot decide", "for", w.FailFor, "last_error", why)
		if w.onChange != nil {
			w.onChange(false, why)
		}
	}
}

func firstWord(s string) string {
	if i := strings.IndexByte(s, ' '); i >= 0 {
		return s[:i]
	}
	return s
}

// probeCmd writes one key that expires by itself: refused like a script's
// write under OOM, NOAUTH, CLUSTERDOWN or READONLY.
var probeCmd = resp.AppendBulkString(resp.AppendBulkString(resp.AppendBulkString(resp.AppendBulkString(resp.AppendBulkString(
	resp.AppendArrayHeader(nil, 5), "SET"), "sluice:ready-probe"), "1"), "PX"), "10000")

// Start runs the probe until Stop: every ProbeEvery, unless a call
// succeeded since the last tick.
func (w *Watch) Start() {
	go func() {
		t := time.NewTicker(w.ProbeEvery)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			if !w.failing.Load() && w.now().UnixNano()-w.lastOK.Load() < int64(w.ProbeEvery) {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), w.ProbeTimeout)
			w.Do(ctx, probeCmd)
			cancel()
			w.check(w.now())
		}
	}()
}

// Stop ends the probe.
func (w *Watch) Stop() { w.stopOnce.Do(func() { close(w.stop) }) }

// WritePrometheus writes the Watch's metrics.
func (w *Watch) WritePrometheus(out io.Writer) {
	fmt.Fprintf(out, "# HELP sluice_redis_calls_total Redis calls of the service by outcome: ok, error_reply (OOM, NOAUTH, CLUSTERDOWN, …), timeout (no reply by --redis-timeout), no_reply (connection refused or lost).\n# TYPE sluice_redis_calls_total counter\n")
	for _, c := range []struct {
		o string
		n *atomic.Uint64
	}{{"ok", &w.ok}, {"error_reply", &w.errorReplies}, {"timeout", &w.timeouts}, {"no_reply", &w.noReply}} {
		fmt.Fprintf(out, "sluice_redis_calls_total{outcome=%q} %d\n", c.o, c.n.Load())
	}
	r := 0
	if w.Ready() {
		r = 1
	}
	fmt.Fprintf(out, "# HELP sluice_ready 1 while the service can decide (Redis answers), 0 while every Redis call fails.\n# TYPE sluice_ready gauge\nsluice_ready %d\n", r)
}

// NodeOf returns the node the cluster sends cmd to ("" when unknown).
func (b *ClusterBackend) NodeOf(cmd []byte) string { return b.c.NodeOf(clusterName, cmd) }
