package filter

import (
	"time"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/usage"
)

// Reservations read from the JSON request body: rules whose cost.request is
// {"json": PATH} (config.CostSource.JSON).
//
//   - A request that has a body and matches such a rule is not decided at its
//     headers: proxy_on_request_headers pauses it (the headers wait), and the
//     body is read as it comes, in proxy_on_request_body, by a streaming JSON
//     reader (filter/usage's Extractor: a fixed-size state, never the body
//     itself) while the host keeps the body with the headers (the callback
//     answers StopIterationAndBuffer). The request is decided — every rule, as
//     at the headers — once the body has ended or max_body bytes have come,
//     and goes on (headers and body together) only if admitted: nothing of a
//     refused request reaches the upstream.
//   - The reservation is the integer at PATH in the first max_body bytes (the
//     last one, if the key repeats: what a decoder into a map would take),
//     from 1 to config.MaxLimit; anything else — absent, null, a string, a
//     fraction, out of range, a body that is not JSON, or one whose first
//     max_body bytes do not hold the value — reserves cost.request.default.
//     A request without a body (end of stream at its headers) reserves the
//     default at its headers.
//   - No request waits longer than body_timeout (the shortest of the rules'):
//     one whose body has not ended by then is decided with what has come.
//     This is also the guard for a host that holds the body along with the
//     headers and so never calls proxy_on_request_body while they wait —
//     Envoy's default: a Wasm filter's paused headers become
//     StopAllIterationAndWatermark unless the PluginConfig sets
//     allow_on_headers_stop_iteration (Envoy 1.35 and later). There every
//     such request waits body_timeout and reserves the default; the filter
//     logs a warning naming the setting the first time a timeout finds no
//     body byte come, and counts sluice.<rule>.body_timeouts.
//   - While a request read this way waits for its remote decisions or its
//     slot (delay), its body stays with its headers (StopIterationAndBuffer):
//     a body chunk must not release the headers before the verdict.
//   - A client that goes away while its body is read ends the wait; the root
//     context's end (proxy_on_done) decides every request still waiting, with
//     what has come.
//
// Records are pooled by the Plugin and listed in arrival order (every request
// of a configuration waits the same body_timeout, so arrival order is deadline
// order; a request decided early leaves the list at once): reading, deciding
// and timing out allocate nothing once the pool has grown to the largest
// number waiting.

// BodyCostMetrics are the metrics of a rule whose reservation is read from the
// request body, named as RuleMetric names them.
var BodyCostMetrics = [1]string{"body_timeouts"}

// bodyWaits is a Plugin's requests whose reservation comes from their body.
type bodyWaits struct {
	p       *Plugin
	h       resumer
	paths   *usage.Paths
	rules   []*rule // the rules with cost.request.json, in order
	limit   int     // the largest max_body
	timeout int64   // the shortest body_timeout (ns)
	// The waiting requests, oldest (earliest deadline) first: a list through the
	// records, so that a request decided early leaves it at once.
	first, last *bodyWait
	free        []*bodyWait
	flowed      bool // a body chunk reached a held request: the host passes bodies while headers wait
	warned      bool
}

// bodyWait is one request whose body is read for its reservation.
type bodyWait struct {
	s        *stream
	deadline int64
	ext      usage.Extractor
	seen     int  // body bytes read
	reading  bool // the body is still being read (the request is undecided): in the list
	prev     *bodyWait
	next     *bodyWait
	// vals[i], taken[i]: the value for rules[i] (path i; 0: the default),
	// taken when its max_body was reached or the body ended.
	vals  []int64
	taken []bool
}

// newBodyWaits prepares the rules whose reservation is read from the body;
// nil when none is.
func newBodyWaits(p *Plugin, rules []*rule) (*bodyWaits, error) {
	var paths []string
	bw := &bodyWaits{p: p}
	for _, r := range rules {
		if r.cost == nil || r.cost.src.JSON == "" {
			continue
		}
		src := &r.cost.src
		r.cost.bodyIdx = len(paths)
		paths = append(paths, src.JSON)
		bw.rules = append(bw.rules, r)
		bw.limit = max(bw.limit, src.MaxBody)
		if t := int64(src.BodyTimeout); bw.timeout == 0 || t < bw.timeout {
			bw.timeout = t
		}
		if err := defineMetric(p.host, abi.MetricCounter, RuleMetric(r.id, BodyCostMetrics[0]), &r.cost.mBody); err != nil {
			return nil, err
		}
	}
	if len(paths) == 0 {
		return nil, nil
	}
	h, err := resumingHost(p.host, `a cost read from the request body ("json")`)
	if err != nil {
		return nil, err
	}
	ps, err := usage.Compile(paths...)
	if err != nil {
		return nil, err // config.jsonPath accepts what Compile does (cost_paths_test.go)
	}
	bw.h, bw.paths = h, ps
	if bw.timeout <= 0 {
		bw.timeout = int64(config.DefaultBodyTimeout)
	}
	return bw, nil
}

// needs reports whether the current request waits for its body: it has one,
// and a rule reading its reservation from the body applies to it.
func (bw *bodyWaits) needs(s *stream) bool {
	if s.reqEnd || s.body != nil {
		return false
	}
	for _, r := range bw.rules {
		if k := bw.p.keyFor(r); k != keyNone && k != keyDeny {
			return true
		}
	}
	return false
}

// await starts reading the body of s: the headers wait.
func (bw *bodyWaits) await(s *stream, now int64) abi.Action {
	w := bw.get()
	w.s, w.deadline, w.seen, w.reading = s, now+bw.timeout, 0, true
	w.ext.Reset(bw.paths, int64(bw.limit))
	for i := range w.taken {
		w.taken[i] = false
	}
	s.body = w
	w.prev, w.next = bw.last, nil
	if bw.last != nil {
		bw.last.next = w
	} else {
		bw.first = w
	}
	bw.last = w
	bw.p.rootPlugin().retick(now, w.deadline)
	return abi.ActionPause
}

// read takes the body of s as the host holds it (size bytes so far: the body
// is buffered, the callback having answered StopIterationAndBuffer) and decides
// the request once it has ended or reached max_body. It returns the body
// callback's action: Continue once admitted (headers and body go on), else
// Pause (StopIterationAndBuffer: the body stays with the headers).
func (bw *bodyWaits) read(s *stream, size int, eos bool) abi.Action {
	w := s.body
	bw.flowed = true
	start := w.seen
	if size < start {
		// Not the buffer the reads so far saw: a host that hands each chunk
		// alone. Take it as the next bytes.
		start = 0
	}
	n := min(size-start, bw.limit-w.seen)
	if n > 0 {
		b, st := bw.p.host.GetBuffer(abi.BufferRequestBody, start, n)
		if st != abi.StatusOK {
			b = nil // decided with what came before
			eos = true
		}
		bw.feed(w, b)
	}
	if !eos && w.seen < bw.limit {
		return abi.ActionPause
	}
	return bw.decide(s)
}

// feed gives b to w's reader, taking each rule's value where its max_body
// ends.
func (bw *bodyWaits) feed(w *bodyWait, b []byte) {
	for len(b) > 0 {
		// The nearest max_body ahead of w.seen, within b.
		cut := len(b)
		for _, r := range bw.rules {
			if m := r.cost.src.MaxBody - w.seen; m > 0 && m < cut {
				cut = m
			}
		}
		w.ext.Write(b[:cut])
		w.seen += cut
		b = b[cut:]
		for i, r := range bw.rules {
			if !w.taken[i] && w.seen >= r.cost.src.MaxBody {
				bw.take(w, i)
			}
		}
	}
}

// take fixes rules[i]'s value from what w's reader holds now.
func (bw *bodyWaits) take(w *bodyWait, i int) {
	v, st := w.ext.Value(i)
	if st != usage.Found || v < 1 || v > config.MaxLimit {
		v = 0 // the default
	}
	w.vals[i], w.taken[i] = v, true
}

// decide ends the read of s's body and decides the request, with s the
// effective context. It returns the action for the paused request.
func (bw *bodyWaits) decide(s *stream) abi.Action {
	w := s.body
	bw.unlink(w)
	w.ext.Finish()
	for i := range bw.rules {
		if !w.taken[i] {
			bw.take(w, i)
		}
	}
	return bw.p.guardedDecide(s)
}

// units is what rule r reserves for s: the value its body gave, else the
// default.
func (bw *bodyWaits) units(s *stream, r *rule) int64 {
	if w := s.body; w != nil && !w.reading && w.vals[r.cost.bodyIdx] > 0 {
		return w.vals[r.cost.bodyIdx]
	}
	return r.cost.src.Default
}

// unlink takes w, whose read ends, out of the list.
func (bw *bodyWaits) unlink(w *bodyWait) {
	if !w.reading {
		return
	}
	w.reading = false
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		bw.first = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		bw.last = w.prev
	}
	w.prev, w.next = nil, nil
}

// next is the earliest deadline (0: nothing waits).
func (bw *bodyWaits) next() int64 {
	if bw == nil || bw.first == nil {
		return 0
	}
	return bw.first.deadline
}

// expire decides every request whose body_timeout has passed (proxy_on_tick),
// or all of them (all: the root context ends), with what has come.
func (bw *bodyWaits) expire(now int64, all bool) {
	for w := bw.first; w != nil && (all || w.deadline <= now); w = bw.first {
		s := w.s
		if w.seen == 0 && !bw.flowed && !bw.warned {
			bw.warned = true
			bw.p.host.Log(abi.LogWarn, "sluice: a request waited "+time.Duration(bw.timeout).String()+
				" for its body while its headers were held, and no body byte came: a reservation read from the request body (cost.request.json) "+
				"needs the host to pass the body while the headers wait — in Envoy, allow_on_headers_stop_iteration: true in the Wasm PluginConfig (Envoy 1.35 or later); "+
				"until then such requests wait body_timeout and reserve cost.request.default")
		}
		if bw.h.SetEffectiveContext(s.id) != abi.StatusOK {
			bw.unlink(w) // the stream is gone; its release recycles w
			continue
		}
		act := bw.decide(s)
		for _, r := range bw.rules {
			if r.applies {
				bw.p.host.IncrementMetric(r.cost.mBody, 1)
			}
		}
		if act == abi.ActionContinue && !s.denied {
			bw.h.ContinueStream()
		}
	}
}

// drop ends the wait of s, whose stream ended.
func (bw *bodyWaits) drop(s *stream) {
	w := s.body
	s.body = nil
	bw.unlink(w)
	bw.put(w)
}

func (bw *bodyWaits) get() *bodyWait {
	if n := len(bw.free); n > 0 {
		w := bw.free[n-1]
		bw.free = bw.free[:n-1]
		return w
	}
	return &bodyWait{vals: make([]int64, len(bw.rules)), taken: make([]bool, len(bw.rules))}
}

func (bw *bodyWaits) put(w *bodyWait) {
	w.s = nil
	bw.free = append(bw.free, w)
}

// guardedDecide decides s after its body was read (onRequest, as at the
// headers), turning a panic into the failure_mode outcome. The current or
// effective context is s.
func (p *Plugin) guardedDecide(s *stream) (act abi.Action) {
	defer func() {
		if r := recover(); r != nil {
			act = p.recovered(s, r)
		}
	}()
	// What selection and match read is the request's again (another request
	// may have run since its headers).
	root := p.rootPlugin()
	root.props.reset(p.host)
	if p != root {
		p.props = root.props
	}
	return p.onRequest(s)
}
