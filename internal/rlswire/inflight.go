package rlswire

import (
	"strconv"
	"strings"
)

// In-flight limits (a sluice rule with "algorithm": "concurrency" on backend "rls"): an
// inline descriptor whose Algorithm is "concurrency" — Limit the most requests of the key
// in flight at once, WindowUS the Retry-After hint of a refusal in µs, Burst 0 — and whose
// seventh entry is InFlight "<op>:<holder>:<n>:<ttl_ms>" is a call of its own on the
// key's slots (the concurrency script of the service's Redis): op "a" acquires n slots for
// holder (a hex id of the caller's worker) if the live holders hold at most limit − n, "r"
// releases n, "w" renews: holder holds n, leased for ttl_ms from now. It is answered OK
// (an acquire granted, a release, a renewal) or OVER_LIMIT (an acquire refused), with
// limit_remaining the slots left after the call and duration_until_reset the hint when
// none is; a ReclaimedHeader "<n>" says how many slots of lapsed holders the call dropped.

// InFlight is the seventh entry of an in-flight call.
const InFlight = "sluice.inflight"

// ConcurrencyAlgorithm is the Algorithm entry of an in-flight call.
const ConcurrencyAlgorithm = "concurrency"

// ReclaimedHeader carries the slots of lapsed holders an in-flight call dropped.
const ReclaimedHeader = "x-sluice-reclaimed"

// The bounds of an InFlight value.
const (
	MaxInFlightN     = 1_000_000_000
	MinInFlightTTLMS = 1
	MaxInFlightTTLMS = 3_600_000
)

// AppendInFlight appends an InFlight value.
func AppendInFlight(b []byte, op byte, holder uint64, n, ttlMS int64) []byte {
	b = append(b, op, ':')
	b = strconv.AppendUint(b, holder, 16)
	b = append(b, ':')
	b = strconv.AppendInt(b, n, 10)
	b = append(b, ':')
	return strconv.AppendInt(b, ttlMS, 10)
}

// ParseInFlight parses an InFlight value: op one of a, r, w; holder 1–16 hex digits; n
// 0..MaxInFlightN (at least 1 for a and r); ttl_ms MinInFlightTTLMS..MaxInFlightTTLMS.
func ParseInFlight(s string) (op byte, holder uint64, n, ttlMS int64, ok bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 || len(parts[0]) != 1 || len(parts[1]) < 1 || len(parts[1]) > 16 {
		return 0, 0, 0, 0, false
	}
	op = parts[0][0]
	if op != 'a' && op != 'r' && op != 'w' {
		return 0, 0, 0, 0, false
	}
	holder, err0 := strconv.ParseUint(parts[1], 16, 64)
	n, err1 := strconv.ParseInt(parts[2], 10, 64)
	ttlMS, err2 := strconv.ParseInt(parts[3], 10, 64)
	if err0 != nil || err1 != nil || err2 != nil || n < 0 || n > MaxInFlightN || (n == 0 && op != 'w') ||
		ttlMS < MinInFlightTTLMS || ttlMS > MaxInFlightTTLMS {
		return 0, 0, 0, 0, false
	}
	return op, holder, n, ttlMS, true
}
