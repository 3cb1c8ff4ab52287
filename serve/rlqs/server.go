// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService) on a Redis
// Cluster: each bucket Envoy's rate_limit_quota filter reports is matched
// against the RLS configuration (serve/rls) as a descriptor of the
// bucket's entries, and every report is answered with assignments whose
// sum over all connected Envoys never exceeds the limit (docs/rlqs.md).
package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/serve/rls"
)

// Defaults of the Options bounds.
const (
	// Envoy reports every bucket it has in one message: a report may name
	// as many buckets as a stream may have. 4 MiB is also gRPC's default
	// bound on a received message.
	DefaultMaxBucketsPerReport = 10000
	DefaultMaxBucketsPerStream = 10000
	DefaultMaxReportBytes      = 4 << 20
	DefaultMaxEntries          = 16
	DefaultMaxEntryBytes       = 512
	DefaultSendQueue           = 16
	DefaultSendTimeout         = 10 * time.Second
	DefaultAbandonAfter        = 5 * time.Minute
	DefaultRedisTimeout        = time.Second
)

// fillInterval is the token buckets' fill interval: one token per year,
// Envoy's least fill rate (AtomicTokenBucketImpl's kMinFillRate), so a
// grant is its max_tokens and nothing more for its life. Its nanos
// distinguish one grant from the next (Envoy keeps a bucket whose
// max_tokens, tokens_per_fill and fill_interval nanos are unchanged, and
// creates a new, full one otherwise).
const fillIntervalSeconds = 365 * 24 * 3600

// firstInterval is a new bucket's reporting interval until its reports
// measure it: Envoy's report period (1.36 to 1.40 report every 5 s,
// whatever reporting_interval says).
const firstInterval = 5 * time.Second

// Options configure a Server.
type Options struct {
	// Backend runs the allocation script (rls.ClusterBackend in sluice serve).
	Backend rls.Backend
	// Config returns the current configuration (may return nil: no limits).
	Config func() *rls.Config
	// Metrics, if nil, are created (Server.Metrics).
	Metrics *Metrics
	Logger  *slog.Logger
	// Now is the clock of the stream timers; nil: time.Now. ScriptClock
	// also passes it to the script instead of Redis TIME (tests).
	Now         func() time.Time
	ScriptClock bool

	RedisTimeout        time.Duration
	MaxBucketsPerReport int
	MaxBucketsPerStream int
	MaxReportBytes      int
	MaxEntries          int
	MaxEntryBytes       int
	SendQueue           int
	SendTimeout         time.Duration
	AbandonAfter        time.Duration
}

// Server implements RateLimitQuotaServiceServer.
type Server struct {
	pb.UnimplementedRateLimitQuotaServiceServer
	o       Options
	alloc   *Allocator
	Metrics *Metrics

	mu       sync.Mutex
	closing  bool
	shutdown chan struct{}
	active   sync.WaitGroup
}

// New returns a Server.
func New(o Options) *Server {
	def := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	def(&o.MaxBucketsPerReport, DefaultMaxBucketsPerReport)
	def(&o.MaxBucketsPerStream, DefaultMaxBucketsPerStream)
	def(&o.MaxReportBytes, DefaultMaxReportBytes)
	def(&o.MaxEntries, DefaultMaxEntries)
	def(&o.MaxEntryBytes, DefaultMaxEntryBytes)
	def(&o.SendQueue, DefaultSendQueue)
	if o.SendTimeout <= 0 {
		o.SendTimeout = DefaultSendTimeout
	}
	if o.AbandonAfter <= 0 {
		o.AbandonAfter = DefaultAbandonAfter
	}
	if o.RedisTimeout <= 0 {
		o.RedisTimeout = DefaultRedisTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Config == nil {
		o.Config = func() *rls.Config { return nil }
	}
	m := o.Metrics
	if m == nil {
		m = NewMetrics(func(d string) bool {
			c := o.Config()
			if c == nil {
				return false
			}
			for _, k := range c.Domains() {
				if k == d {
					return true
				}
			}
			return false
		})
	}
	s := &Server{o: o, Metrics: m, shutdown: make(chan struct{})}
	s.alloc = &Allocator{Backend: o.Backend, NoScript: m.noscript}
	return s
}

// Shutdown ends every open stream with OK (each Envoy reconnects, to
// another replica behind the same address) and refuses new ones with
// UNAVAILABLE; it returns when the streams' handlers have returned or ctx
// ends.
func (s *Server) Shutdown(ctx context.Context) {
	s.mu.Lock()
	if !s.closing {
		s.closing = true
		close(s.shutdown)
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// bucket kinds: the assignment a stream last sent for a bucket.
const (
	kindNone = iota
	kindTokenBucket
	kindDeny
	kindAllow
)

type bucket struct {
	key     string // canonical
	tag     string // a digest of key, in participant ids and the c: index
	id      *pb.BucketId
	entries []rls.Entry
	// participant names the bucket of this stream in the pool's ledger (two
	// buckets may share a pool: share_threshold).
	participant string

	kind        int
	ws          int64 // window start (µs) of a token bucket / deny of a limited bucket
	size        int64 // the token bucket's max_tokens
	used        int64 // allowed reported since the token bucket was sent
	nanos       int32 // the token bucket's fill_interval nanos
	limitKey    string
	ttlSent     time.Duration // the TTL of the last assignment sent
	sentAt      time.Time     // the current strategy was first sent
	refreshedAt time.Time     // last sent (its TTL runs from here)
	ttl         time.Duration
	interval    time.Duration
	lastRecv    time.Time
	prevRecv    time.Time
	windowEnd   time.Time // zero: no push due
	idleSince   time.Time
	warned      bool
	// replaced: what the bucket replaced by the current one held at most
	// (less what was reported allowed since): returned to the pool once
	// the replacement has certainly reached the Envoy.
	replaced int64

	// the limit of the last report (for pushes)
	limit  int64
	window time.Duration

	// claim: the bucket may continue another stream's participant
	// (continue.go); nothing is allocated or sent until its next report.
	claim *claim
	// dups counts the participants of its own this stream took after
	// another stream took over the previous one.
	dups int
}

type stream struct {
	s       *Server
	id      string
	client  string // ClientHeader: the Envoy's name, "" if it gave none
	domain  string
	buckets map[string]*bucket
	seq     uint32
}

var errSlowReader = status.Error(codes.ResourceExhausted, "rlqs: the client does not read its responses")

// StreamRateLimitQuotas implements the service: one goroutine receives
// (blocking when the reports are not processed yet: flow control, bounded
// memory), this one decides and queues responses, one goroutine sends. A
// queue that is full, or a send that does not complete within SendTimeout,
// ends the stream with RESOURCE_EXHAUSTED.
func (s *Server) StreamRateLimitQuotas(gs grpc.BidiStreamingServer[pb.RateLimitQuotaUsageReports, pb.RateLimitQuotaResponse]) (err error) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "rlqs: shutting down")
	}
	s.active.Add(1)
	s.mu.Unlock()
	defer s.active.Done()

	ctx, cancel := context.WithCancelCause(gs.Context())
	defer cancel(nil)
	st, err := s.newStream(gs.Context())
	if err != nil {
		return err
	}
	defer func() {
		if st.domain != "" {
			n := int64(len(st.buckets))
			s.Metrics.with(st.domain, func(d *domainStats) { d.streams--; d.buckets -= n })
		}
		if err != nil {
			s.Metrics.streamError(status.Code(err).String())
		}
	}()

	reports := make(chan *pb.RateLimitQuotaUsageReports)
	recvErr := make(chan error, 1)
	go receive(ctx, gs, reports, recvErr)
	sendq := make(chan *pb.RateLimitQuotaResponse, s.o.SendQueue)
	sendErr := make(chan error, 1)
	go send(ctx, cancel, gs, sendq, s.o.SendTimeout, sendErr)
	enqueue := func(r *pb.RateLimitQuotaResponse) error {
		if r == nil || len(r.BucketAction) == 0 {
			return nil
		}
		select {
		case sendq <- r:
			return nil
		default:
			return errSlowReader
		}
	}

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	arm := func() {
		next := st.nextPush()
		timer.Stop()
		if next.IsZero() {
			return
		}
		timer.Reset(max(next.Sub(s.o.Now()), 0) + 5*time.Millisecond)
	}
	timer.Stop()
	for {
		select {
		case <-s.shutdown:
			return nil
		case <-ctx.Done():
			if c := context.Cause(ctx); errors.Is(c, errSlowReader) {
				return errSlowReader
			}
			return status.FromContextError(ctx.Err()).Err()
		case err := <-sendErr:
			return err
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case m := <-reports:
			r, err := st.report(ctx, m)
			if err != nil {
				return err
			}
			if err := enqueue(r); err != nil {
				return err
			}
			arm()
		case <-timer.C:
			if err := enqueue(st.push(ctx)); err != nil {
				return err
			}
			arm()
		}
	}
}

// newStream is the state of a stream that begins in ctx, with the client
// identity its metadata names, if any.
func (s *Server) newStream(ctx context.Context) (*stream, error) {
	st := &stream{s: s, id: newID(), buckets: map[string]*bucket{}}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(ClientHeader); len(v) > 0 {
			if err := validClient(v[0]); err != nil {
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
			st.client = v[0]
		}
	}
	var b [2]byte
	_, _ = rand.Read(b[:])
	st.seq = uint32(b[0])<<8 | uint32(b[1])
	return st, nil
}

// receive hands the stream's reports to reports, one at a time, until the
// stream ends (its error to recvErr) or ctx is done.
func receive(ctx context.Context, gs grpc.BidiStreamingServer[pb.RateLimitQuotaUsageReports, pb.RateLimitQuotaResponse],
	reports chan<- *pb.RateLimitQuotaUsageReports, recvErr chan<- error) {
	for {
		m, err := gs.Recv()
		if err != nil {
			recvErr <- err
			return
		}
		select {
		case reports <- m:
		case <-ctx.Done():
			return
		}
	}
}

// send sends the responses queued in sendq until ctx is done or a send
// fails (its error to sendErr); a send that takes longer than timeout
// cancels the stream with errSlowReader.
func send(ctx context.Context, cancel context.CancelCauseFunc, gs grpc.BidiStreamingServer[pb.RateLimitQuotaUsageReports, pb.RateLimitQuotaResponse],
	sendq <-chan *pb.RateLimitQuotaResponse, timeout time.Duration, sendErr chan<- error) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-sendq:
			t := time.AfterFunc(timeout, func() { cancel(errSlowReader) })
			err := gs.Send(r)
			t.Stop()
			if err != nil {
				sendErr <- err
				return
			}
		}
	}
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// canonical is a bucket's map key: its entries sorted by key.
func canonical(m map[string]string) (string, []rls.Entry) {
	es := make([]rls.Entry, 0, len(m))
	for k, v := range m {
		es = append(es, rls.Entry{Key: k, Value: v})
	}
	sort.Slice(es, func(i, j int) bool { return es[i].Key < es[j].Key })
	var b strings.Builder
	for _, e := range es {
		b.WriteString(strconv.Quote(e.Key))
		b.WriteByte('=')
		b.WriteString(strconv.Quote(e.Value))
		b.WriteByte(';')
	}
	return b.String(), es
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "rlqs: "+format, args...)
}

// validate checks a report's bounds before anything is counted.
func (st *stream) validate(m *pb.RateLimitQuotaUsageReports) error {
	o := &st.s.o
	if n := proto.Size(m); n > o.MaxReportBytes {
		return invalid("a report of %d bytes (at most %d)", n, o.MaxReportBytes)
	}
	d := m.GetDomain()
	switch {
	case st.domain == "" && d == "":
		return invalid("the first report of a stream has no domain")
	case st.domain != "" && d != "" && d != st.domain:
		return invalid("domain %q on a stream of domain %q (open a new stream for another domain)", d, st.domain)
	case len(d) > o.MaxEntryBytes:
		return invalid("a domain of %d bytes (at most %d)", len(d), o.MaxEntryBytes)
	}
	us := m.GetBucketQuotaUsages()
	if len(us) > o.MaxBucketsPerReport {
		return invalid("%d buckets in one report (at most %d)", len(us), o.MaxBucketsPerReport)
	}
	for i, u := range us {
		b := u.GetBucketId().GetBucket()
		if len(b) == 0 {
			return invalid("bucket_quota_usages[%d]: an empty bucket_id", i)
		}
		if len(b) > o.MaxEntries {
			return invalid("bucket_quota_usages[%d]: %d bucket_id entries (at most %d)", i, len(b), o.MaxEntries)
		}
		for k, v := range b {
			if k == "" || len(k) > o.MaxEntryBytes || len(v) > o.MaxEntryBytes {
				return invalid("bucket_quota_usages[%d]: an empty key or a key or value over %d bytes", i, o.MaxEntryBytes)
			}
		}
	}
	return nil
}

// job is one bucket's allocation of a report or push.
type job struct {
	b     *bucket
	q     Request
	valid bool // the current assignment is of this limit and not expired
	push  bool
	res   Result
	err   error
	slot  int
}

// report decides one report: an action for every bucket it names (none
// for a bucket whose allocation failed: the Envoy keeps its assignment).
func (st *stream) report(ctx context.Context, m *pb.RateLimitQuotaUsageReports) (*pb.RateLimitQuotaResponse, error) {
	if err := st.validate(m); err != nil {
		return nil, err
	}
	s := st.s
	if st.domain == "" {
		st.domain = m.GetDomain()
		s.Metrics.with(st.domain, func(d *domainStats) { d.streams++ })
	}
	now := s.o.Now()
	order := mergeUsages(m)
	added := 0
	for _, u := range order {
		if st.buckets[u.key] == nil {
			added++
		}
	}
	if len(st.buckets)+added > s.o.MaxBucketsPerStream {
		return nil, status.Errorf(codes.ResourceExhausted, "rlqs: more than %d buckets on one stream", s.o.MaxBucketsPerStream)
	}
	if added > 0 {
		s.Metrics.with(st.domain, func(d *domainStats) { d.buckets += int64(added) })
	}
	cfg := s.o.Config()
	// One action per bucket, in the report's order (none for a bucket
	// whose allocation failed).
	slots := make([][]*pb.RateLimitQuotaResponse_BucketAction, len(order))
	var jobs []*job
	var claims []*claimJob
	for i, u := range order {
		action, c, claim := st.decideUsage(cfg, i, u, now)
		switch {
		case action != nil:
			slots[i] = one(action)
		case c == nil:
		case claim:
			claims = append(claims, c)
		default:
			jobs = append(jobs, st.prepare(c, now))
		}
	}
	if len(claims) > 0 {
		jobs = append(jobs, st.claims(ctx, claims, now)...)
	}
	st.run(ctx, jobs)
	for _, j := range jobs {
		slots[j.slot] = st.apply(j, now)
	}
	out := &pb.RateLimitQuotaResponse{}
	for _, as := range slots {
		out.BucketAction = append(out.BucketAction, as...)
	}
	return out, nil
}

// bucketUsage is one bucket's usage in a report, the usages of a bucket named
// twice merged.
type bucketUsage struct {
	key             string
	entries         []rls.Entry
	id              map[string]string
	allowed, denied uint64
	elapsed         time.Duration // time_elapsed (Envoy: whole seconds)
}

// mergeUsages is m's usages in order, one per bucket.
func mergeUsages(m *pb.RateLimitQuotaUsageReports) []*bucketUsage {
	var order []*bucketUsage
	byKey := map[string]*bucketUsage{}
	for _, u := range m.GetBucketQuotaUsages() {
		k, es := canonical(u.GetBucketId().GetBucket())
		if x := byKey[k]; x != nil {
			x.allowed = satAdd(x.allowed, u.GetNumRequestsAllowed())
			x.denied = satAdd(x.denied, u.GetNumRequestsDenied())
			x.elapsed = 0 // named twice: not a plain continuation
			continue
		}
		x := &bucketUsage{key: k, entries: es, id: u.GetBucketId().GetBucket(), allowed: u.GetNumRequestsAllowed(), denied: u.GetNumRequestsDenied(),
			elapsed: u.GetTimeElapsed().AsDuration()}
		byKey[k] = x
		order = append(order, x)
	}
	return order
}

// decideUsage decides report slot i, usage u, at now: an action answered at
// once, or the allocation it needs (claim: through the claim path, the
// bucket is new to this participant or already claiming), or neither.
func (st *stream) decideUsage(cfg *rls.Config, i int, u *bucketUsage, now time.Time) (action *pb.RateLimitQuotaResponse_BucketAction, c *claimJob, claim bool) {
	s := st.s
	b, fresh, elapsed := st.received(u, now)
	if u.allowed == 0 && u.denied == 0 {
		if b.idleSince.IsZero() {
			b.idleSince = now
		} else if now.Sub(b.idleSince) >= s.o.AbandonAfter {
			delete(st.buckets, u.key)
			s.Metrics.with(st.domain, func(d *domainStats) { d.buckets--; d.actions[actionAbandon]++ })
			return &pb.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
				BucketAction: &pb.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &pb.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}, nil, false
		}
	} else {
		b.idleSince = time.Time{}
	}

	mt := cfg.Match(st.domain, u.entries)
	switch {
	case mt == nil || mt.Limit.Unlimited || mt.Limit.Shadow:
		s.Metrics.with(st.domain, func(d *domainStats) { d.nolimit++ })
		return st.blanket(b, kindAllow, now), nil, false
	case mt.Limit.Kind != algorithms.FixedWindow:
		s.Metrics.with(st.domain, func(d *domainStats) { d.unsupported++ })
		if !b.warned {
			b.warned = true
			s.o.Logger.Warn("rlqs: only fixed_window limits are served over RLQS; the bucket is answered ALLOW_ALL",
				"domain", st.domain, "limit", mt.FullKey, "algorithm", mt.Limit.Kind.String())
		}
		return st.blanket(b, kindAllow, now), nil, false
	}
	s.Metrics.with(st.domain, func(d *domainStats) { d.used += u.allowed; d.denied += u.denied })
	if mt.Limit.Params.Limit == 0 {
		return st.blanket(b, kindDeny, now), nil, false
	}
	key := Key(st.domain, mt.KeyPart)
	c = &claimJob{slot: i, b: b, key: key, limit: mt.Limit.Params.Limit, window: mt.Limit.Params.Window,
		allowed: u.allowed, denied: u.denied, elapsed: elapsed}
	switch {
	case b.claim != nil:
		return nil, c, true
	case fresh && st.client != "" && u.elapsed >= time.Second:
		c.peek, c.reported = true, u.elapsed
		return nil, c, true
	}
	return nil, c, false
}

// received is u's bucket (made when new: fresh), its report interval
// measured again with this report, received at now, and the time the
// report covers.
func (st *stream) received(u *bucketUsage, now time.Time) (b *bucket, fresh bool, elapsed time.Duration) {
	b = st.buckets[u.key]
	fresh = b == nil
	if b == nil {
		id := make(map[string]string, len(u.id))
		for k, v := range u.id {
			id[k] = v
		}
		// Until measured, the interval is Envoy's report period (5 s), or
		// the report's time_elapsed if longer (a stream that reconnected):
		// the first assignment's TTL must outlast the next report.
		tag := strconv.FormatUint(fnv64(u.key), 36)
		b = &bucket{key: u.key, tag: tag, id: &pb.BucketId{Bucket: id}, entries: u.entries, interval: min(max(firstInterval, u.elapsed), time.Minute),
			participant: st.id + "." + tag}
		st.buckets[u.key] = b
	}
	elapsed = b.interval
	if !b.lastRecv.IsZero() {
		gap := now.Sub(b.lastRecv)
		elapsed = max(gap, time.Millisecond)
		if gap > b.interval {
			b.interval = gap
		} else {
			b.interval = (b.interval + gap) / 2
		}
		b.interval = min(max(b.interval, 100*time.Millisecond), time.Minute)
	}
	b.prevRecv, b.lastRecv = b.lastRecv, now
	b.ttl = ttlFor(b.interval)
	st.s.Metrics.with(st.domain, func(d *domainStats) { d.reports++ })
	return b, fresh, elapsed
}

// prepare is the allocation job of a report of a limited bucket.
func (st *stream) prepare(c *claimJob, now time.Time) *job {
	b, key := c.b, c.key
	valid := b.limitKey == key && b.inForce(now)
	if !valid {
		b.kind = kindNone
	}
	if b.kind == kindTokenBucket {
		b.used = satAddI(b.used, c.allowed)
	}
	b.limitKey, b.limit, b.window = key, c.limit, c.window
	j := &job{b: b, valid: valid, q: st.request(b, now), slot: c.slot}
	j.q.Allowed, j.q.Denied, j.q.Elapsed = c.allowed, c.denied, c.elapsed
	// Proven empty: denials in a report whose period began (the previous
	// report) when the current assignment had reached the Envoy (half an
	// interval after it was sent). A continued participant's first report
	// also carries the counts of the report before (c.lastDenied: this
	// report's own).
	denied := c.denied
	if c.continued {
		denied = c.lastDenied
	}
	j.q.Empty = valid && denied > 0 && !b.prevRecv.IsZero() && b.prevRecv.Sub(b.sentAt) >= b.interval/2
	// A replaced bucket held at most b.replaced at the report that
	// replaced it; until the new one arrived it admitted at most what
	// the reports since say was allowed; the rest was never spent. Known
	// once this report was built after the replacement arrived.
	if b.replaced > 0 {
		b.replaced = max(b.replaced-int64(min(c.allowed, math.MaxInt64)), 0)
		if now.Sub(b.sentAt) >= b.interval/2 {
			j.q.Credit, b.replaced = b.replaced, 0
		}
	}
	if !valid {
		b.replaced = 0
	}
	j.q.Replaced = b.replaced
	return j
}

// inForce says whether the Envoy still enforces b's last limited
// assignment (a token bucket or DENY_ALL): its TTL, as sent, has not
// passed, with half a second to spare.
func (b *bucket) inForce(now time.Time) bool {
	return (b.kind == kindTokenBucket || b.kind == kindDeny) && now.Sub(b.refreshedAt) < b.ttlSent-500*time.Millisecond
}

// clientField is b's field in the c: index of the stream's Envoy name.
func (st *stream) clientField(b *bucket) string { return st.client + "." + b.tag }

// request is the allocation request of b's current state.
func (st *stream) request(b *bucket, now time.Time) Request {
	q := Request{Key: b.limitKey, Limit: b.limit, Window: b.window, Participant: b.participant, CurrentWindow: -1,
		Interval: b.interval, Expiry: max(b.ttl, b.ttlSent) + b.interval + time.Second}
	if st.s.o.ScriptClock {
		q.Now = now
	}
	switch b.kind {
	case kindTokenBucket:
		q.CurrentWindow, q.Held = b.ws, max(b.size-b.used, 0)
	case kindDeny:
		q.CurrentWindow = b.ws
	}
	// The nanos of a grant, reserved now (jobs run in parallel).
	st.seq++
	q.NextNanos = int32(st.seq % 1_000_000_000)
	if st.client != "" {
		q.Owner, q.ClientField = st.id, st.clientField(b)
		q.Size, q.Used, q.Nanos, q.Replaced, q.SentAgo = b.size, b.used, b.nanos, b.replaced, now.Sub(b.sentAt)
		switch b.kind {
		case kindTokenBucket:
			q.Kind = 'T'
		case kindDeny:
			q.Kind = 'D'
		}
	}
	return q
}

// push allocates the new window of every bucket whose window ended.
func (st *stream) push(ctx context.Context) *pb.RateLimitQuotaResponse {
	now := st.s.o.Now()
	var jobs []*job
	for _, b := range st.buckets {
		if b.windowEnd.IsZero() || now.Before(b.windowEnd) {
			continue
		}
		valid := b.inForce(now)
		if !valid {
			b.kind = kindNone
		}
		jobs = append(jobs, &job{b: b, valid: valid, push: true, q: st.request(b, now)})
	}
	if len(jobs) == 0 {
		return nil
	}
	st.run(ctx, jobs)
	out := &pb.RateLimitQuotaResponse{}
	for _, j := range jobs {
		if isTaken(j.err) {
			// The Envoy went on on another stream.
			j.b.windowEnd, j.b.kind = time.Time{}, kindNone
			continue
		}
		if j.err != nil {
			j.b.windowEnd = now.Add(time.Second) // try again
			continue
		}
		out.BucketAction = append(out.BucketAction, st.apply(j, now)...)
	}
	return out
}

// parallel runs f(0) … f(n−1), at most 16 at a time, and waits for them.
func parallel(n int, f func(i int)) {
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(i)
		}()
	}
	wg.Wait()
}

// run runs the jobs' allocations, at most 16 at a time.
func (st *stream) run(ctx context.Context, jobs []*job) {
	parallel(len(jobs), func(i int) {
		j := jobs[i]
		c, cancel := context.WithTimeout(ctx, st.s.o.RedisTimeout)
		defer cancel()
		j.res, j.err = st.s.alloc.Allocate(c, &j.q)
		if isTaken(j.err) && !j.push {
			// Another stream continues this participant: the Envoy of this
			// stream has the same name (a duplicate). It goes on as a
			// participant of its own.
			st.s.Metrics.continued("duplicate")
			st.s.o.Logger.Warn("rlqs: another stream took over this stream's participant; two Envoys share one "+ClientHeader+"?",
				"domain", st.domain, "client", st.client)
			j.b.dups++
			j.b.participant = st.id + "." + j.b.tag + ".d" + strconv.Itoa(j.b.dups)
			j.q.Participant = j.b.participant
			j.res, j.err = st.s.alloc.Allocate(c, &j.q)
		}
	})
}

// apply turns an allocation into the bucket's action.
//
// A new token bucket is sent after a DENY_ALL for the same bucket, in one
// response: Envoy applies a response's actions in order and publishes the
// result once, so no request sees the DENY_ALL, and the token bucket
// replaces a blanket rule, which Envoy always creates full (replacing a
// token bucket, Envoy 1.40 starts the new one as full as the old one was,
// e.g. empty after an empty one).
func (st *stream) apply(j *job, now time.Time) []*pb.RateLimitQuotaResponse_BucketAction {
	b, s := j.b, st.s
	if j.err != nil {
		s.Metrics.redisError()
		s.o.Logger.Warn("rlqs: allocation failed; the Envoy keeps its assignment until its TTL", "domain", st.domain, "err", j.err)
		return nil
	}
	grant := false
	r := j.res
	b.windowEnd = now.Add(r.Left)
	switch {
	case r.Grant > 0:
		b.replaced = 0
		if j.valid && b.kind == kindTokenBucket && b.ws == r.WindowStart {
			b.replaced = j.q.Held
		}
		b.kind, b.size, b.used, b.ws = kindTokenBucket, r.Grant, 0, r.WindowStart
		b.nanos = j.q.NextNanos
		b.sentAt, b.refreshedAt = now, now
		s.Metrics.with(st.domain, func(d *domainStats) { d.assigned += uint64(r.Grant); d.actions[actionTokenBucket]++ })
		grant = true
	case j.valid && b.ws == r.WindowStart && !r.Revoke:
		b.refreshedAt = now
		s.Metrics.with(st.domain, func(d *domainStats) { d.actions[actionRepeat]++ })
	default:
		b.kind, b.ws = kindDeny, r.WindowStart
		b.sentAt, b.refreshedAt = now, now
		s.Metrics.with(st.domain, func(d *domainStats) { d.actions[actionDenyAll]++ })
	}
	if grant {
		return []*pb.RateLimitQuotaResponse_BucketAction{denyAll(b), st.action(b)}
	}
	return one(st.action(b))
}

func one(a *pb.RateLimitQuotaResponse_BucketAction) []*pb.RateLimitQuotaResponse_BucketAction {
	return []*pb.RateLimitQuotaResponse_BucketAction{a}
}

// denyAll is a DENY_ALL for b (the first of a grant's two actions).
func denyAll(b *bucket) *pb.RateLimitQuotaResponse_BucketAction {
	return &pb.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
		BucketAction: &pb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &pb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(b.ttl),
			RateLimitStrategy:    &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}},
		}}}
}

// blanket answers b with ALLOW_ALL or DENY_ALL (no limit to allocate).
func (st *stream) blanket(b *bucket, kind int, now time.Time) *pb.RateLimitQuotaResponse_BucketAction {
	if b.kind != kind {
		b.sentAt = now
	}
	b.kind, b.refreshedAt, b.windowEnd, b.limitKey = kind, now, time.Time{}, ""
	a := actionAllowAll
	if kind == kindDeny {
		a = actionDenyAll
	}
	st.s.Metrics.with(st.domain, func(d *domainStats) { d.actions[a]++ })
	return st.action(b)
}

// action is b's current assignment as a BucketAction.
func (st *stream) action(b *bucket) *pb.RateLimitQuotaResponse_BucketAction {
	b.ttlSent = b.ttl // what Envoy enforces: not the TTL computed later
	strat := &typev3.RateLimitStrategy{}
	switch b.kind {
	case kindTokenBucket:
		strat.Strategy = &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens:     uint32(min(b.size, math.MaxUint32)),
			TokensPerFill: wrapperspb.UInt32(1),
			FillInterval:  &durationpb.Duration{Seconds: fillIntervalSeconds, Nanos: b.nanos},
		}}
	case kindDeny:
		strat.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}
	default:
		strat.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}
	}
	return &pb.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
		BucketAction: &pb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &pb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(b.ttl),
			RateLimitStrategy:    strat,
		}}}
}

// nextPush is the earliest window end of the stream's limited buckets.
func (st *stream) nextPush() time.Time {
	var next time.Time
	for _, b := range st.buckets {
		if !b.windowEnd.IsZero() && (next.IsZero() || b.windowEnd.Before(next)) {
			next = b.windowEnd
		}
	}
	return next
}

// ttlFor is the assignments' TTL for a reporting interval: two intervals
// and a second, in whole seconds (Envoy reads only the seconds), 2..120 s.
func ttlFor(interval time.Duration) time.Duration {
	s := int64(math.Ceil((2*interval + time.Second).Seconds()))
	return time.Duration(min(max(s, 2), 120)) * time.Second
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return math.MaxUint64
	}
	return a + b
}

func satAddI(a int64, b uint64) int64 {
	if b > uint64(math.MaxInt64-a) {
		return math.MaxInt64
	}
	return a + int64(b)
}
