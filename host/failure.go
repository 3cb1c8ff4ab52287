package host

import (
	"fmt"
	"time"
)

// FailurePolicy is what a worker does once its VM has failed, as Envoy's failure_policy
// (envoy.extensions.wasm.v3.PluginConfig; PluginConfig::createContext and
// maybeReloadHandleIfNeeded in envoyproxy/envoy source/extensions/common/wasm/wasm.cc).
// host/doc.go ("Traps") says what each does to the request that trapped and to the later ones.
type FailurePolicy int

const (
	// FailClosed is Envoy's default (failure_policy unset, fail_open false; checked on the
	// 1.36.4 and 1.40.0 release builds): the worker keeps its failed VM and answers every
	// request 503 wasm_fail_stream until the process restarts.
	FailClosed FailurePolicy = iota
	// FailReload: as FailClosed, but the first request that comes at least the backoff
	// after the worker's last load reloads the VM (and is served by the new one).
	FailReload
	// FailOpen: the request that trapped gets 503 wasm_fail_stream; the later requests of
	// that worker skip the filter and go to the upstream unfiltered. With Options.FailOpen
	// (Envoy's legacy fail_open: true) the request that trapped goes through as well.
	FailOpen
)

// DefaultReloadBackoff is Envoy's default reload_config.backoff.base_interval.
const DefaultReloadBackoff = time.Second

var failurePolicyNames = [...]string{FailClosed: "fail-closed", FailReload: "fail-reload", FailOpen: "fail-open"}

func (p FailurePolicy) String() string {
	if p >= 0 && int(p) < len(failurePolicyNames) {
		return failurePolicyNames[p]
	}
	return fmt.Sprintf("FailurePolicy(%d)", int(p))
}

// ParseFailurePolicy reads "fail-closed", "fail-reload" or "fail-open" (also Envoy's
// spellings FAIL_CLOSED, FAIL_RELOAD, FAIL_OPEN); "" is FailClosed.
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	switch s {
	case "", "fail-closed", "FAIL_CLOSED":
		return FailClosed, nil
	case "fail-reload", "FAIL_RELOAD":
		return FailReload, nil
	case "fail-open", "FAIL_OPEN":
		return FailOpen, nil
	}
	return 0, fmt.Errorf("host: unknown failure policy %q (fail-closed, fail-reload or fail-open)", s)
}

// failStreamDetails is the response code details of Envoy's failure reply
// (FailStreamResponseDetails in source/extensions/common/wasm/context.cc).
const failStreamDetails = "wasm_fail_stream"

// grpcUnavailable is the grpc-status Envoy's failure reply carries to a gRPC request.
const grpcUnavailable = 14

// failReply is what Envoy's Context::failStream sends when the VM has failed: 503 with no
// body, details wasm_fail_stream, gRPC status UNAVAILABLE — for a gRPC request the
// trailers-only form (content-type application/grpc, grpc-status 14, no grpc-message).
func (s *stream) failReply() *localReply {
	lr := &localReply{status: 503, details: failStreamDetails, grpcStatus: grpcUnavailable}
	s.rec.setDetails(failStreamDetails)
	if s.grpc {
		lr = grpcLocalReply(lr, s.head)
	}
	return lr
}

// passes tells whether a failed stream goes on to the upstream unfiltered: its worker had no
// VM and the policy is FailOpen (the filter is skipped), or Options.FailOpen (legacy
// fail_open: also the request whose callback trapped).
func (s *stream) passes() bool {
	return s.bypass || s.h.opts.FailOpen
}

// reloadDue reports whether a worker whose VM failed may load a new one now (FailReload),
// counting a refusal as Envoy counts vm_reload_backoff. Envoy draws the interval anew for
// every request, at random in [base, 1.5×base) (JitteredLowerBoundBackOffStrategy,
// source/common/common/backoff_strategy.cc), and measures it from the last load — the
// worker's start or its last reload attempt, failed or not — not from the failure, so the
// first request after a failure long after the last load reloads at once.
func (w *worker) reloadDue() bool {
	base := int64(w.h.opts.ReloadBackoff / time.Millisecond)
	if base < 2 {
		base = 2
	}
	interval := time.Duration(base+w.h.jitter(base>>1)) * time.Millisecond
	if w.h.clock.Now().Sub(w.lastLoad) < interval {
		w.reloadBackoffs.Add(1)
		return false
	}
	return true
}
