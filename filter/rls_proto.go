package filter

import (
	"errors"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// The protobuf messages of envoy.service.ratelimit.v3, encoded and decoded
// by hand: the guest must not carry google.golang.org/protobuf, and a
// request is encoded into one reused buffer and a reply decoded into
// preallocated arrays (no allocation per request). Field numbers are those
// of envoy/service/ratelimit/v3/rls.proto and
// envoy/extensions/common/ratelimit/v3/ratelimit.proto (go-control-plane's
// generated code, checked by the round-trip tests).
//
//	RateLimitRequest     { string domain = 1; repeated RateLimitDescriptor descriptors = 2; uint32 hits_addend = 3; }
//	RateLimitDescriptor  { repeated Entry entries = 1; ...; google.protobuf.UInt64Value hits_addend = 3; }
//	Entry                { string key = 1; string value = 2; }   UInt64Value { uint64 value = 1; }
//	RateLimitResponse    { Code overall_code = 1; repeated DescriptorStatus statuses = 2;
//	                       repeated config.core.v3.HeaderValue response_headers_to_add = 3; ... }
//	DescriptorStatus     { Code code = 1; RateLimit current_limit = 2; uint32 limit_remaining = 3;
//	                       google.protobuf.Duration duration_until_reset = 4; Quota quota = 5; }
//	Quota                { uint32 requests = 1; google.protobuf.Timestamp valid_until = 2; string id = 3; }
//	HeaderValue          { string key = 1; string value = 2; bytes raw_value = 3; }
//	Duration             { int64 seconds = 1; int32 nanos = 2; }

// RateLimitResponse.Code.
const (
	rlsCodeUnknown   = 0
	rlsCodeOK        = 1
	rlsCodeOverLimit = 2
)

// Protobuf wire types.
const (
	wireVarint = 0
	wireI64    = 1
	wireLen    = 2
	wireI32    = 5
)

func appendVarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func varintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// appendEntry appends a descriptor entry (field 1 of RateLimitDescriptor)
// whose value is already valid UTF-8.
func appendEntry(b []byte, key string, value []byte) []byte {
	n := 1 + varintLen(uint64(len(key))) + len(key) + 1 + varintLen(uint64(len(value))) + len(value)
	b = append(b, 1<<3|wireLen)
	b = appendVarint(b, uint64(n))
	b = append(b, 1<<3|wireLen)
	b = appendVarint(b, uint64(len(key)))
	b = append(b, key...)
	b = append(b, 2<<3|wireLen)
	b = appendVarint(b, uint64(len(value)))
	return append(b, value...)
}

// appendRuleEntries appends the fixed entries of rule rc, named id (its
// name, or <scope>.<name> in a "_rules_" scope, as its counters are):
// sluice.rule, sluice.algorithm, sluice.limit, sluice.window_us,
// sluice.burst (the bucket's capacity; 0 for the window algorithms, which
// have none).
func appendRuleEntries(b []byte, id string, rc *config.Rule) []byte {
	p := rc.Limiter.Params()
	burst := p.Burst
	if rc.Algorithm != algorithms.TokenBucket && rc.Algorithm != algorithms.LeakyBucket {
		burst = 0
	}
	b = appendEntry(b, rlswire.Rule, escapeKey(nil, []byte(id)))
	b = appendEntry(b, rlswire.Algorithm, []byte(rc.Algorithm.String()))
	b = appendEntry(b, rlswire.Limit, strconv.AppendInt(nil, p.Limit, 10))
	b = appendEntry(b, rlswire.WindowUS, strconv.AppendInt(nil, int64(p.Window/time.Microsecond), 10))
	return appendEntry(b, rlswire.Burst, strconv.AppendInt(nil, burst, 10))
}

// escapeKey appends key with every byte that is not part of valid UTF-8,
// and '%', written as %XX (upper-case hex): a proto string must be UTF-8.
func escapeKey(dst, key []byte) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(key); {
		c := key[i]
		if c < utf8.RuneSelf {
			if c == '%' {
				dst = append(dst, '%', '2', '5')
			} else {
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(key[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, '%', hex[c>>4], hex[c&15])
		} else {
			dst = append(dst, key[i:i+n]...)
		}
		i += n
	}
	return dst
}

// escapedKeyLen is len(escapeKey(nil, key)).
func escapedKeyLen(key []byte) int {
	n := 0
	for i := 0; i < len(key); {
		c := key[i]
		if c < utf8.RuneSelf {
			if c == '%' {
				n += 3
			} else {
				n++
			}
			i++
			continue
		}
		r, k := utf8.DecodeRune(key[i:])
		if r == utf8.RuneError && k == 1 {
			n += 3
		} else {
			n += k
		}
		i += k
	}
	return n
}

// appendRequest appends the RateLimitRequest for the rules (indices) of w:
// one descriptor each, with its refund entry when refund is set, and its
// cost as its hits_addend when above 1.
func (rs *rlsState) appendRequest(b []byte, w *rlsWait, rules []int, refund bool) []byte {
	b = rs.appendDomain(b)
	for _, i := range rules {
		if !refund {
			if us := w.maxUS[i]; us > 0 {
				rs.num = strconv.AppendInt(rs.num[:0], us, 10)
				b = appendDescriptor(b, rs.entriesFor(w, i), w.keys[i], rlswire.MaxDelayUS, rs.num, w.cost[i])
				continue
			}
			b = appendDescriptor(b, rs.entriesFor(w, i), w.keys[i], "", nil, w.cost[i])
			continue
		}
		res := &w.res[i]
		rs.num = rlswire.AppendPair(rs.num[:0], res.stamp, res.ref)
		b = appendDescriptor(b, rs.entriesFor(w, i), w.keys[i], rlswire.Refund, rs.num, w.cost[i])
	}
	b = append(b, 3<<3|wireVarint)
	return append(b, 1) // hits_addend
}

// appendLeaseRequest appends the RateLimitRequest of lease call q of rule
// lr: one descriptor, the rule's entries and key and sluice.lease =
// "<n>:<instances>" (an acquire) or sluice.return = "<n>:<stamp>".
func (rs *rlsState) appendLeaseRequest(b []byte, lr *leaseRule, q *redisrl.LeaseRequest) []byte {
	b = rs.appendDomain(b)
	if q.Return {
		rs.num = rlswire.AppendPair(rs.num[:0], q.N, q.Stamp)
		b = appendDescriptor(b, rs.p.rules[lr.rule].rls.entries, q.Key, rlswire.Return, rs.num, 0)
	} else {
		rs.num = rlswire.AppendPair(rs.num[:0], q.N, q.Instances)
		b = appendDescriptor(b, rs.p.rules[lr.rule].rls.entries, q.Key, rlswire.Lease, rs.num, 0)
	}
	b = append(b, 3<<3|wireVarint)
	return append(b, 1) // hits_addend
}

// appendSettleRequest appends the RateLimitRequest settling rule i's key:
// one descriptor, the rule's entries and key and sluice.settle =
// "<delta>".
func (rs *rlsState) appendSettleRequest(b []byte, i int, key []byte, delta int64) []byte {
	b = rs.appendDomain(b)
	rs.num = strconv.AppendInt(rs.num[:0], delta, 10)
	b = appendDescriptor(b, rs.p.rules[i].rls.entries, key, rlswire.Settle, rs.num, 0)
	b = append(b, 3<<3|wireVarint)
	return append(b, 1) // hits_addend
}

func (rs *rlsState) appendDomain(b []byte) []byte {
	b = append(b, 1<<3|wireLen)
	b = appendVarint(b, uint64(len(rs.cfg.Domain)))
	return append(b, rs.cfg.Domain...)
}

// appendDescriptor appends a descriptor (field 2 of RateLimitRequest): the
// rule's fixed entries, sluice.key (escaped), the entry extra = val when
// extra is not empty, and hits_addend = hits when hits > 1 (the request's
// hits_addend, 1, applies otherwise).
func appendDescriptor(b, fixed, key []byte, extra string, val []byte, hits int64) []byte {
	kl := escapedKeyLen(key)
	keyEntry := 1 + varintLen(uint64(len(rlswire.Key))) + len(rlswire.Key) + 1 + varintLen(uint64(kl)) + kl
	n := len(fixed) + 1 + varintLen(uint64(keyEntry)) + keyEntry
	if extra != "" {
		e := 1 + varintLen(uint64(len(extra))) + len(extra) + 1 + varintLen(uint64(len(val))) + len(val)
		n += 1 + varintLen(uint64(e)) + e
	}
	if hits > 1 {
		n += 2 + 1 + varintLen(uint64(hits))
	}
	b = append(b, 2<<3|wireLen)
	b = appendVarint(b, uint64(n))
	b = append(b, fixed...)
	b = append(b, 1<<3|wireLen)
	b = appendVarint(b, uint64(keyEntry))
	b = append(b, 1<<3|wireLen)
	b = appendVarint(b, uint64(len(rlswire.Key)))
	b = append(b, rlswire.Key...)
	b = append(b, 2<<3|wireLen)
	b = appendVarint(b, uint64(kl))
	b = escapeKey(b, key)
	if extra != "" {
		b = appendEntry(b, extra, val)
	}
	if hits > 1 {
		b = append(b, 3<<3|wireLen, byte(1+varintLen(uint64(hits))), 1<<3|wireVarint)
		b = appendVarint(b, uint64(hits))
	}
	return b
}

// rlsResponse is a decoded RateLimitResponse: what the filter reads of it.
type rlsResponse struct {
	overall uint64
	n       int         // statuses decoded
	st      []rlsStatus // by descriptor index (cap: the most descriptors a call has)
	refunds []rlsRefund // by descriptor index
	leases  []rlsLease  // by descriptor index
	delays  []rlsDelay  // by descriptor index
}

// rlsDelay is an x-sluice-delay header: a shaped admission's wait.
type rlsDelay struct {
	ok bool
	us int64
}

type rlsStatus struct {
	code      uint64
	remaining uint64
	dur       time.Duration // duration_until_reset
	quota     uint64        // quota.requests (an acquire's grant)
}

type rlsRefund struct {
	ok         bool
	stamp, ref int64
}

// rlsLease is an x-sluice-lease header: a grant's stamp and validity.
type rlsLease struct {
	ok    bool
	stamp int64
	valid time.Duration
}

func (r *rlsResponse) init(maxDescriptors int) {
	r.st = make([]rlsStatus, maxDescriptors)
	r.refunds = make([]rlsRefund, maxDescriptors)
	r.leases = make([]rlsLease, maxDescriptors)
	r.delays = make([]rlsDelay, maxDescriptors)
}

var (
	errProtoTruncated = errors.New("truncated protobuf")
	errProtoVarint    = errors.New("protobuf varint too long")
	errProtoWireType  = errors.New("unsupported protobuf wire type")
)

// readVarint reads a varint from b at i.
func readVarint(b []byte, i int) (uint64, int, error) {
	var v uint64
	for s := 0; s < 64; s += 7 {
		if i >= len(b) {
			return 0, i, errProtoTruncated
		}
		c := b[i]
		i++
		v |= uint64(c&0x7f) << s
		if c < 0x80 {
			return v, i, nil
		}
	}
	return 0, i, errProtoVarint
}

// protoField reads one field of b at i: its number, wire type, varint
// value (wireVarint) or the bounds of its bytes (wireLen); fixed-size
// fields are skipped.
func protoField(b []byte, i int) (num uint64, wt int, v uint64, start, end int, err error) {
	var tag uint64
	if tag, i, err = readVarint(b, i); err != nil {
		return
	}
	num, wt = tag>>3, int(tag&7)
	if num == 0 {
		err = errors.New("protobuf field number 0")
		return
	}
	switch wt {
	case wireVarint:
		v, i, err = readVarint(b, i)
		end = i
	case wireI64, wireI32:
		n := 8
		if wt == wireI32 {
			n = 4
		}
		if len(b)-i < n {
			err = errProtoTruncated
			return
		}
		end = i + n
	case wireLen:
		if v, i, err = readVarint(b, i); err != nil {
			return
		}
		if v > uint64(len(b)-i) {
			err = errProtoTruncated
			return
		}
		start, end = i, i+int(v)
	default:
		err = errProtoWireType
	}
	return
}

// decode decodes a RateLimitResponse for a call of n descriptors (n ≤ the
// capacity given to init). A reply that is not a well-formed message, has
// more statuses than descriptors, or fewer, is an error; unknown fields are
// skipped. Refund tokens (response_headers_to_add x-sluice-refund), lease
// stamps (x-sluice-lease) and delays (x-sluice-delay) are recorded by
// descriptor index.
func (r *rlsResponse) decode(b []byte, n int) error {
	r.overall, r.n = 0, 0
	if n > len(r.st) {
		return errors.New("more descriptors than the decoder holds")
	}
	for k := 0; k < n; k++ {
		r.st[k] = rlsStatus{}
		r.refunds[k] = rlsRefund{}
		r.leases[k] = rlsLease{}
		r.delays[k] = rlsDelay{}
	}
	for i := 0; i < len(b); {
		num, wt, v, s, e, err := protoField(b, i)
		if err != nil {
			return err
		}
		i = e
		switch num {
		case 1:
			if wt != wireVarint {
				return errors.New("overall_code: wrong wire type")
			}
			r.overall = v
		case 2:
			if wt != wireLen {
				return errors.New("statuses: wrong wire type")
			}
			if r.n >= n {
				return errors.New("more statuses than the " + strconv.Itoa(n) + " descriptors sent")
			}
			if err := r.st[r.n].decode(b[s:e]); err != nil {
				return errors.New("statuses[" + strconv.Itoa(r.n) + "]: " + err.Error())
			}
			r.n++
		case 3:
			if wt != wireLen {
				return errors.New("response_headers_to_add: wrong wire type")
			}
			if err := r.header(b[s:e], n); err != nil {
				return err
			}
		}
	}
	if r.n != n {
		return errors.New(strconv.Itoa(r.n) + " statuses for " + strconv.Itoa(n) + " descriptors")
	}
	switch r.overall {
	case rlsCodeOK, rlsCodeOverLimit:
	default:
		return errors.New("overall_code " + strconv.FormatUint(r.overall, 10))
	}
	return nil
}

// maxRLSDuration bounds duration_until_reset (a longer one is an error).
const maxRLSDuration = 100 * 366 * 24 * time.Hour

func (st *rlsStatus) decode(b []byte) error {
	for i := 0; i < len(b); {
		num, wt, v, s, e, err := protoField(b, i)
		if err != nil {
			return err
		}
		i = e
		switch num {
		case 1:
			if wt != wireVarint {
				return errors.New("code: wrong wire type")
			}
			st.code = v
		case 3:
			if wt != wireVarint {
				return errors.New("limit_remaining: wrong wire type")
			}
			st.remaining = uint64(uint32(v))
		case 4:
			if wt != wireLen {
				return errors.New("duration_until_reset: wrong wire type")
			}
			d, err := decodeDuration(b[s:e])
			if err != nil {
				return errors.New("duration_until_reset: " + err.Error())
			}
			st.dur = d
		case 5:
			if wt != wireLen {
				return errors.New("quota: wrong wire type")
			}
			q, err := decodeQuotaRequests(b[s:e])
			if err != nil {
				return errors.New("quota: " + err.Error())
			}
			st.quota = q
		}
	}
	return nil
}

// decodeQuotaRequests reads Quota.requests (its other fields are skipped).
func decodeQuotaRequests(b []byte) (uint64, error) {
	var n uint64
	for i := 0; i < len(b); {
		num, wt, v, _, e, err := protoField(b, i)
		if err != nil {
			return 0, err
		}
		i = e
		if num == 1 {
			if wt != wireVarint {
				return 0, errors.New("requests: wrong wire type")
			}
			n = uint64(uint32(v))
		}
	}
	return n, nil
}

func decodeDuration(b []byte) (time.Duration, error) {
	var sec, nanos int64
	for i := 0; i < len(b); {
		num, wt, v, _, e, err := protoField(b, i)
		if err != nil {
			return 0, err
		}
		i = e
		switch num {
		case 1:
			if wt != wireVarint {
				return 0, errors.New("seconds: wrong wire type")
			}
			sec = int64(v)
		case 2:
			if wt != wireVarint {
				return 0, errors.New("nanos: wrong wire type")
			}
			nanos = int64(int32(v))
		}
	}
	if sec < 0 || nanos < 0 || nanos >= 1e9 || sec > int64(maxRLSDuration/time.Second) {
		return 0, errors.New("out of range")
	}
	return time.Duration(sec)*time.Second + time.Duration(nanos), nil
}

// header records a refund token or a lease stamp from a HeaderValue;
// other headers are ignored.
func (r *rlsResponse) header(b []byte, n int) error {
	var key, val []byte
	for i := 0; i < len(b); {
		num, wt, _, s, e, err := protoField(b, i)
		if err != nil {
			return err
		}
		i = e
		if (num == 1 || num == 2 || num == 3) && wt != wireLen {
			return errors.New("response_headers_to_add: wrong wire type")
		}
		switch num {
		case 1:
			key = b[s:e]
		case 2, 3: // value, raw_value
			val = b[s:e]
		}
	}
	switch string(key) {
	case rlswire.RefundHeader:
		idx, stamp, ref, ok := rlswire.ParseToken(val)
		if !ok || idx >= n {
			return errors.New(rlswire.RefundHeader + ": malformed token")
		}
		r.refunds[idx] = rlsRefund{ok: true, stamp: stamp, ref: ref}
	case rlswire.LeaseHeader:
		idx, stamp, valid, ok := rlswire.ParseToken(val)
		if !ok || idx >= n || stamp < 0 || valid < 0 || valid > int64(maxRLSDuration/time.Microsecond) {
			return errors.New(rlswire.LeaseHeader + ": malformed value")
		}
		r.leases[idx] = rlsLease{ok: true, stamp: stamp, valid: time.Duration(valid) * time.Microsecond}
	case rlswire.DelayHeader:
		idx, us, ok := rlswire.ParseIndexed(val)
		if !ok || idx >= n {
			return errors.New(rlswire.DelayHeader + ": malformed value")
		}
		r.delays[idx] = rlsDelay{ok: true, us: us}
	}
	return nil
}
