// Package rlswire is the contract between the filter's rls backend and `sluice serve` on top
// of Envoy's RLS v3 protocol: the entry names of an inline descriptor, the response headers
// that answer them, and the text of their values. The guest encodes with it and the service
// parses with it (and the other way round for the headers), so each name and format is
// written once.
//
// An inline descriptor has the Fixed entries in this order — Rule (the rule name, or
// "<scope>.<rule>" for a rule of a "_rules_" scope), Algorithm, Limit, WindowUS (the window
// in microseconds), Burst (0 for the window algorithms), Key (the filter's key, escaped to
// UTF-8, opaque to the service) — and at most one more: Refund "<stamp>:<ref>" (undo an
// earlier admission), Lease "<n>:<instances>" (an acquire), Return "<n>:<stamp>" (give
// back n admissions of the grant of that stamp), MaxDelayUS "<µs>" (a shaped decision) or
// Settle "<delta>" (settle a token budget's reservation).
// An admitted decision is answered with a RefundHeader "<i>:<stamp>:<ref>", a granted
// acquire with a LeaseHeader "<i>:<stamp>:<valid_us>", i being the descriptor's index in
// the request.
//
// Shaping (a rule's "delay"): a decision descriptor whose seventh entry is MaxDelayUS
// "<µs>" (1 .. MaxDelayLimitUS, token_bucket and leaky_bucket only) is decided with a
// queue of at most that many µs (algorithms.Shaper.DecideDelay, in the script: the slot
// is taken in the key's state on Redis, so the requests of one key queue across every
// proxy). An admission into a later slot is answered OK with a DelayHeader
// "<i>:<delay_us>", the wait from the decision until the slot; no header means no wait.
// A request that would wait longer is OVER_LIMIT with duration_until_reset the wait
// minus the max delay (when a retry would be queued). A caller that does not send
// MaxDelayUS never gets a DelayHeader, and one that does not understand it would only
// release the request early: plain envoyproxy/ratelimit and Envoy's ratelimit filter
// neither send nor read either.
//
// Token budgets (a sluice rule's "cost"): a decision descriptor's cost is its
// RateLimitDescriptor.hits_addend (the request's hits_addend when unset), and so is its
// Refund's, which gives that cost back. When the response has ended, a descriptor whose
// seventh entry is Settle "<delta>" (token_bucket and leaky_bucket only; delta = actual −
// reserved, a non-zero decimal integer, |delta| <= MaxSettle) settles the key: a charge
// when positive, the key going into debt when it does not fit, a refund up to a full
// bucket when negative (algorithms.Settler.Settle, in the script: redisrl Request.Settle).
// It is no decision: it takes no part in overall_code or in the service's all-or-nothing
// refund of a denied call, and is answered OK (limit_remaining and duration_until_reset
// the key's after it); hits_addend is ignored. A settlement that fails (out of the
// script's range, Redis down) fails the call (UNAVAILABLE, or INVALID_ARGUMENT for a
// malformed one): nothing is settled.
//
// It imports only the standard library and builds for the guest (GOOS=wasip1); the append
// and parse helpers of the guest's side do not allocate.
package rlswire

import (
	"strconv"
	"strings"
)

// The entry keys of an inline descriptor.
const (
	Rule      = "sluice.rule"
	Algorithm = "sluice.algorithm"
	Limit     = "sluice.limit"
	WindowUS  = "sluice.window_us"
	Burst     = "sluice.burst"
	Key       = "sluice.key"
	Refund    = "sluice.refund" // a refund: "<stamp>:<ref>"
	Lease     = "sluice.lease"  // a lease acquire: "<n>:<instances>"
	Return    = "sluice.return" // a lease return: "<n>:<stamp>"
	// MaxDelayUS shapes a decision: "<µs>", the longest wait for a slot.
	MaxDelayUS = "sluice.max_delay_us"
	// Settle settles a token budget's reservation: "<delta>", actual − reserved.
	Settle = "sluice.settle"
)

// MaxSettle bounds |delta| of a Settle entry (algorithms.MaxSettle).
const MaxSettle = 1_000_000_000_000

// MaxDelayLimitUS bounds a MaxDelayUS value (one minute: config.MaxDelay).
const MaxDelayLimitUS = 60_000_000

// The response headers (response_headers_to_add) of an answer to inline descriptors.
const (
	// RefundHeader carries an admitted decision's refund token "<i>:<stamp>:<ref>" for
	// inline descriptor i: the entry Refund "<stamp>:<ref>" undoes it.
	RefundHeader = "x-sluice-refund"
	// LeaseHeader carries what a granted acquire's pool needs, "<i>:<stamp>:<valid_us>" for
	// inline descriptor i: the grant's stamp, to name in its return, and how long its
	// admissions may be spent (0 = no bound from the algorithm).
	LeaseHeader = "x-sluice-lease"
	// DelayHeader carries a shaped admission's wait, "<i>:<delay_us>" for inline
	// descriptor i (sent only when the wait is not zero).
	DelayHeader = "x-sluice-delay"
)

// FixedEntries is the number of entries every inline descriptor starts with.
const FixedEntries = 6

// Fixed are the keys of the first FixedEntries entries, in their order.
var Fixed = [FixedEntries]string{Rule, Algorithm, Limit, WindowUS, Burst, Key}

// Optional are the keys the entry after the fixed ones may have, as a phrase.
const Optional = Refund + ", " + Lease + ", " + Return + ", " + MaxDelayUS + " or " + Settle

// MaxTokenIndex bounds the descriptor index of a header value (ParseToken).
const MaxTokenIndex = 1 << 20

// AppendPair appends the value of a Refund, Lease or Return entry: "<x>:<y>" in decimal.
func AppendPair(b []byte, x, y int64) []byte {
	b = strconv.AppendInt(b, x, 10)
	b = append(b, ':')
	return strconv.AppendInt(b, y, 10)
}

// ParsePair parses the value of a Refund, Lease or Return entry, "<x>:<y>": two
// non-negative integers as strconv.ParseInt reads them.
func ParsePair(s string) (x, y int64, ok bool) {
	a, b, ok := strings.Cut(s, ":")
	x, err1 := strconv.ParseInt(a, 10, 64)
	y, err2 := strconv.ParseInt(b, 10, 64)
	if !ok || err1 != nil || err2 != nil || x < 0 || y < 0 {
		return 0, 0, false
	}
	return x, y, true
}

// AppendToken appends the value of a RefundHeader or a LeaseHeader: "<i>:<x>:<y>" in
// decimal.
func AppendToken(b []byte, i int, x, y int64) []byte {
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, ':')
	return AppendPair(b, x, y)
}

// ParseToken parses the value of a RefundHeader or a LeaseHeader, "<i>:<x>:<y>": decimal
// digits, x and y with an optional '-', i at most MaxTokenIndex, nothing else.
func ParseToken(b []byte) (i int, x, y int64, ok bool) {
	var parts [3]int64
	at := 0
	for k := 0; k < 3; k++ {
		j := at
		neg := false
		if j < len(b) && b[j] == '-' && k > 0 {
			neg = true
			j++
		}
		start := j
		var v int64
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			if v > (1<<63-1)/10-1 {
				return 0, 0, 0, false
			}
			v = v*10 + int64(b[j]-'0')
			j++
		}
		if j == start {
			return 0, 0, 0, false
		}
		if neg {
			v = -v
		}
		parts[k] = v
		if k < 2 {
			if j >= len(b) || b[j] != ':' {
				return 0, 0, 0, false
			}
			j++
		} else if j != len(b) {
			return 0, 0, 0, false
		}
		at = j
	}
	if parts[0] > MaxTokenIndex {
		return 0, 0, 0, false
	}
	return int(parts[0]), parts[1], parts[2], true
}

// AppendIndexed appends the value of a DelayHeader: "<i>:<x>" in decimal.
func AppendIndexed(b []byte, i int, x int64) []byte {
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, ':')
	return strconv.AppendInt(b, x, 10)
}

// ParseIndexed parses the value of a DelayHeader, "<i>:<x>": decimal digits only (no
// sign), i at most MaxTokenIndex, x below 10^18, nothing else. It does not allocate.
func ParseIndexed(b []byte) (i int, x int64, ok bool) {
	var parts [2]int64
	at := 0
	for k := 0; k < 2; k++ {
		j := at
		var v int64
		for j < len(b) && b[j] >= '0' && b[j] <= '9' && j-at < 18 {
			v = v*10 + int64(b[j]-'0')
			j++
		}
		if j == at {
			return 0, 0, false
		}
		parts[k] = v
		if k == 0 {
			if j >= len(b) || b[j] != ':' {
				return 0, 0, false
			}
			j++
		} else if j != len(b) {
			return 0, 0, false
		}
		at = j
	}
	if parts[0] > MaxTokenIndex {
		return 0, 0, false
	}
	return int(parts[0]), parts[1], true
}

// ParseDelta parses the value of a Settle entry: a non-zero decimal integer with an
// optional '-', no leading zero, |delta| at most MaxSettle.
func ParseDelta(s string) (int64, bool) {
	d := strings.TrimPrefix(s, "-")
	if d == "" || d[0] < '1' || d[0] > '9' || len(d) > 13 {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n == 0 || n > MaxSettle || n < -MaxSettle {
		return 0, false
	}
	return n, true
}
