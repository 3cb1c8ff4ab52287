package filter

import (
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// Plans on the remote backends: the parameters travel with the call, as a rule's own do. A
// request under a plan is a call of its own (not coalesced with others of its key, which
// may be under another plan); its descriptor (rls) or script arguments (redis) carry the
// plan's limit, window and burst, and its decision's Limit is the plan's capacity. Under
// failure_mode "local" the fallback decides with the rule's own limit / instances.

// entriesFor returns the fixed descriptor entries of rule i for wait w: the rule's own, or
// those of w's plan, encoded into the rule's scratch.
func (rs *rlsState) entriesFor(w *rlsWait, i int) []byte {
	return rs.entriesForPlan(i, w.plan[i])
}

// entriesForPlan returns the fixed descriptor entries of rule i under plan pl (nil: the
// rule's own), encoded into the rule's scratch.
func (rs *rlsState) entriesForPlan(i int, pl *config.PlanEntry) []byte {
	r := rs.p.rules[i]
	if pl == nil {
		return r.rls.entries
	}
	burst := pl.Params.Burst
	if r.cfg.Algorithm != algorithms.TokenBucket && r.cfg.Algorithm != algorithms.LeakyBucket {
		burst = 0
	}
	if r.rls.head == 0 {
		// The entries sluice.rule and sluice.algorithm: the start of the rule's own, once.
		r.rls.head = len(appendEntry(appendEntry(nil, rlswire.Rule, escapeKey(nil, []byte(r.id))), rlswire.Algorithm, []byte(r.cfg.Algorithm.String())))
	}
	var num [20]byte
	b := append(r.rls.plan[:0], r.rls.entries[:r.rls.head]...)
	b = appendEntry(b, rlswire.Limit, strconv.AppendInt(num[:0], pl.Params.Limit, 10))
	b = appendEntry(b, rlswire.WindowUS, strconv.AppendInt(num[:0], int64(pl.Params.Window/time.Microsecond), 10))
	b = appendEntry(b, rlswire.Burst, strconv.AppendInt(num[:0], burst, 10))
	r.rls.plan = b
	return b
}
