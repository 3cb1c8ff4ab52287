package envoyproc

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"time"
)

// WaitStat polls /stats every 50 ms until the stat named name (exactly) satisfies ok, and
// returns its value then. It fails at ctx's deadline, or when Envoy exits, with the last
// value seen (-1: the stat was never there).
func (e *Envoy) WaitStat(ctx context.Context, name string, ok func(int64) bool) (int64, error) {
	last := int64(-1)
	for {
		st, err := e.Stats(url.QueryEscape("^" + regexp.QuoteMeta(name) + "$"))
		if err == nil {
			if v, found := st[name]; found {
				last = v
				if ok(v) {
					return v, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("envoy %s: stat %s = %d, not the value waited for (%v)", e.Target.Version, name, last, ctx.Err())
		case <-e.done:
			return last, fmt.Errorf("envoy %s exited (%v) while waiting for stat %s (last %d)", e.Target.Version, e.err, name, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
