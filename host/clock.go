package host

import (
	"context"
	"errors"
	"time"
)

// Clock is the time a Host runs on (Options.Clock): what the guest reads (WASI
// clock_time_get, proxy_get_current_time_nanoseconds), when proxy_on_tick is due,
// FailReload's backoff, proxy_http_call and proxy_grpc_call timeouts, CallTimeout, and
// Stats.Uptime. The default is the wall clock (WallClock); tests give a clock they step
// (host/fakeclock), so that time passes when they say and never while they wait.
//
// An implementation is safe for concurrent use; Now never goes backwards.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer arms a one-shot timer: the time is sent on c (buffered, one value) once d
	// has passed on this clock (at once when d ≤ 0). stop disarms it and reports whether
	// it did (false: it had fired or was stopped).
	NewTimer(d time.Duration) (c <-chan time.Time, stop func() bool)
}

// WallClock returns the wall clock: time.Now and time.NewTimer.
func WallClock() Clock { return wallClock{} }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// withTimeout is context.WithTimeout on the host's clock. On the wall clock it is exactly
// context.WithTimeout (a gRPC call sends its deadline to the server). On another clock the
// context has no deadline to report (it would be a time of that clock): it is cancelled once
// timeout has passed on the clock, with the cause context.DeadlineExceeded (context.Cause),
// which the caller reports as a timeout.
func (h *Host) withTimeout(parent context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if _, wall := h.clock.(wallClock); wall {
		return context.WithTimeout(parent, timeout)
	}
	ctx, cancel := context.WithCancelCause(parent)
	fired, stop := h.clock.NewTimer(timeout)
	go func() {
		select {
		case <-fired:
			cancel(context.DeadlineExceeded)
		case <-ctx.Done():
			stop()
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// timedOut reports whether ctx (from withTimeout, or derived from it) ended because its
// timeout passed.
func timedOut(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), context.DeadlineExceeded)
}
