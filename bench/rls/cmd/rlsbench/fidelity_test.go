package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

// fidelityConfig is one configuration both services load unchanged: every
// unit the test can cross deterministically (second) or not at all (minute,
// hour: the clock is the same for both), nested descriptors, shadow_mode,
// quota_mode, requests_per_unit 0 and unlimited.
const fidelityConfig = `domain: fidelity
descriptors:
  - key: sec
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: min
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: user
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 4}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: unl
    rate_limit: {unlimited: true}
`

// The migration claim: envoyproxy/ratelimit and `sluice serve
// --charge-denied`, each on its own keys of one Redis Cluster, answer the
// same sequence of calls — several descriptors per call, several keys,
// crossing every limit, hits_addend 0, 1, 2 and per descriptor, across
// several one-second windows — with no difference in overall code,
// descriptor codes, current limit, limit_remaining or duration_until_reset.
//
// The peer is the one bench/rls pins, 3fb7025: the newest pseudo-version
// the Go module proxy serves, older than the peer's 05c08d0 (#1059), which
// changed how quota_mode answers. The counting of every descriptor, quota
// ones included, and every status of a descriptor outside quota mode are
// checked against the pinned peer itself. A quota_mode descriptor's status
// and the call's overall code follow #1059, sluice's table of it
// (serve/rls TestQuotaMode): the pinned peer's answer is rewritten to
// that rule (quota1059) before the comparison — an over quota descriptor,
// which the pinned peer answers OK without a reset, is OVER_LIMIT with the
// window's reset, and the call is over when a descriptor outside quota
// mode is, or every quota one is.
//
// Both read the machine's clock (the peer its own, sluice Redis TIME) and
// round duration_until_reset to whole seconds, so the two answers of one
// call agree when both fall in one second: a pair is sent only in the first
// 700 ms of a second (the test waits for the next second's start
// otherwise), and a pair that straddles a second all the same fails the
// test with that reason, since the counters of the two would then differ.
func TestFidelityChargeDenied(t *testing.T) {
	if testing.Short() {
		t.Skip("builds envoyproxy/ratelimit and sluice and starts a Redis Cluster")
	}
	benchDir, err := benchModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	peerBin, sluiceBin, err := build(benchDir, dir)
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := redistest.Start(filepath.Join(dir, "redis"), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()

	peer, peerAddr, err := startPeer(peerBin, dir, cluster.Addrs, []byte(fidelityConfig))
	if err != nil {
		t.Fatal(err)
	}
	defer peer.stop()
	sl, slAddr, err := startSluice(sluiceBin, dir, cluster.Addrs, []byte(fidelityConfig), "--charge-denied")
	if err != nil {
		t.Fatal(err)
	}
	defer sl.stop()
	var clients [2]*client
	for i, s := range []struct {
		p    *proc
		addr string
	}{{peer, peerAddr}, {sl, slAddr}} {
		c, err := dial(s.addr, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer c.close()
		// "unl" is unlimited: ready's probe needs a limit, "hour" has one;
		// its probe value is not used below.
		if err := ready(c, "fidelity", "hour", time.Now().Add(60*time.Second)); err != nil {
			t.Fatalf("%s: %v\n%s", s.p.name, err, s.p.tail())
		}
		clients[i] = c
	}

	keys := []string{"sec", "sec", "min", "hour", "user", "shadow", "quota", "zero", "unl", "none"}
	// A pair of calls must land in one second at both services. A call that would start
	// late in a second waits for the next one (both services see the same sequence, so the
	// pause changes nothing); a pair that straddles a second anyway (the machine stalled)
	// spoils that attempt's state, and the sequence starts again on fresh values.
	const attempts, windows, perWindow = 3, 8, 60
	compared, statuses, overs, differ, quotaOvers := 0, 0, 0, 0, 0
	for a := 1; ; a++ {
		rng := rand.New(rand.NewPCG(22, 1))
		values := []string{"a", "b", "c"}
		for i := range values {
			values[i] += "-" + strconv.Itoa(a)
		}
		newCall := func() *rlsv3.RateLimitRequest {
			req := &rlsv3.RateLimitRequest{Domain: "fidelity", HitsAddend: uint32(rng.IntN(3))} // 0 means 1
			for n := 1 + rng.IntN(4); n > 0; n-- {
				k, v := keys[rng.IntN(len(keys))], values[rng.IntN(len(values))]
				d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
				if k == "user" {
					d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "path", Value: "/" + v})
				}
				switch r := rng.IntN(20); {
				case r == 0:
					d.HitsAddend = wrapperspb.UInt64(0)
				case r == 1:
					d.HitsAddend = wrapperspb.UInt64(3)
				}
				req.Descriptors = append(req.Descriptors, d)
			}
			return req
		}
		nextSecond := func() {
			next := time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)
			time.Sleep(time.Until(next))
		}
		compared, statuses, overs, differ, quotaOvers = 0, 0, 0, 0, 0
		straddled := ""
	sequence:
		for w := 0; w < windows; w++ {
			nextSecond() // a new window of the "sec" limits
			for i := 0; i < perWindow; i++ {
				req := newCall()
				if now := time.Now(); now.Sub(now.Truncate(time.Second)) > 700*time.Millisecond {
					nextSecond()
				}
				sec := time.Now().Unix()
				var got [2]*rlsv3.RateLimitResponse
				for j, c := range clients {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					got[j], err = c.rls[0].ShouldRateLimit(ctx, req)
					cancel()
					if err != nil {
						t.Fatalf("window %d call %d: %s: %v", w, i, []string{"peer", "sluice"}[j], err)
					}
				}
				if after := time.Now().Unix(); after != sec {
					straddled = fmt.Sprintf("window %d call %d: the pair straddled a second (%d → %d): the machine stalled", w, i, sec, after)
					break sequence
				}
				quotaOvers += quota1059(req, got[0], sec)
				if d := diff(got[0], got[1]); d != "" {
					t.Errorf("window %d call %d %v:\n%s", w, i, describe(req), d)
					differ++
				}
				compared++
				statuses += len(req.Descriptors)
				if got[0].OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
					overs++
				}
			}
		}
		if straddled == "" {
			break
		}
		if a == attempts {
			t.Fatalf("attempt %d of %d: %s", a, attempts, straddled)
		}
		t.Logf("attempt %d: %s; starting again on fresh values", a, straddled)
	}
	t.Logf("%d calls (%d descriptor statuses) compared over %d one-second windows, %d of them OVER_LIMIT at the peer (%d quota_mode statuses over, rewritten to #1059); %d differ",
		compared, statuses, windows, overs, quotaOvers, differ)
	if overs == 0 || overs == compared {
		t.Errorf("%d of %d calls over the limit: the sequence does not cross the limits", overs, compared)
	}
	if quotaOvers == 0 {
		t.Errorf("no quota_mode descriptor over its limit: the sequence does not cover quota mode")
	}

	// The peer (at the pinned version) ignores is_negative_hits: such a
	// call is charged like any other. sluice gives the hits back instead.
	neg := func(c *client) uint32 {
		req := &rlsv3.RateLimitRequest{Domain: "fidelity", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "hour", Value: "negative"}}, HitsAddend: wrapperspb.UInt64(2), IsNegativeHits: true}}}
		r, err := c.rls[0].ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return r.Statuses[0].LimitRemaining
	}
	if p, s := neg(clients[0]), neg(clients[1]); p != 18 || s != 20 {
		t.Errorf("is_negative_hits on a fresh hour counter: peer remaining %d (want 18: charged), sluice %d (want 20: nothing to give back)", p, s)
	}
}

// quota1059 rewrites r, the pinned peer's answer to req at Unix second now,
// to the quota rule of the peer since 05c08d0 (#1059): a quota_mode
// descriptor ("quota", one minute) over its limit — which the pinned peer
// answers OK, with its limit and remaining 0, without a reset — is
// OVER_LIMIT with the minute's reset (the peer's CalculateReset: the unit
// minus now's offset in it); the call is OVER_LIMIT when a descriptor
// outside quota mode is, or every quota_mode one is.
// It returns how many statuses it rewrote.
func quota1059(req *rlsv3.RateLimitRequest, r *rlsv3.RateLimitResponse, now int64) int {
	over, quotas, quotaOver, rewrote := false, 0, 0, 0
	for i, d := range req.Descriptors {
		st := r.Statuses[i]
		if d.Entries[0].Key != "quota" {
			over = over || st.Code == rlsv3.RateLimitResponse_OVER_LIMIT
			continue
		}
		quotas++
		if st.Code == rlsv3.RateLimitResponse_OK && st.CurrentLimit != nil && st.DurationUntilReset == nil {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			st.DurationUntilReset = durationpb.New(time.Duration(60-now%60) * time.Second)
			rewrote++
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			quotaOver++
		}
	}
	r.OverallCode = rlsv3.RateLimitResponse_OK
	if over || quotas > 0 && quotaOver == quotas {
		r.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return rewrote
}

// diff describes the differences between two answers to one call, "" when
// none: overall code; per descriptor code, current limit (requests per
// unit, unit), limit_remaining, duration_until_reset.
func diff(peer, sluice *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	if peer.OverallCode != sluice.OverallCode {
		fmt.Fprintf(&b, "  overall: peer %v, sluice %v\n", peer.OverallCode, sluice.OverallCode)
	}
	if len(peer.Statuses) != len(sluice.Statuses) {
		fmt.Fprintf(&b, "  %d statuses from the peer, %d from sluice\n", len(peer.Statuses), len(sluice.Statuses))
		return b.String()
	}
	for i := range peer.Statuses {
		if p, s := status(peer.Statuses[i]), status(sluice.Statuses[i]); p != s {
			fmt.Fprintf(&b, "  descriptor %d: peer %s, sluice %s\n", i, p, s)
		}
	}
	return b.String()
}

func status(st *rlsv3.RateLimitResponse_DescriptorStatus) string {
	limit := "no limit"
	if l := st.CurrentLimit; l != nil {
		limit = fmt.Sprintf("%d/%v", l.RequestsPerUnit, l.Unit)
	}
	reset := "none"
	if st.DurationUntilReset != nil {
		reset = st.DurationUntilReset.AsDuration().String()
	}
	return fmt.Sprintf("%v %s remaining %d reset %s", st.Code, limit, st.LimitRemaining, reset)
}

func describe(req *rlsv3.RateLimitRequest) string {
	var parts []string
	for _, d := range req.Descriptors {
		var es []string
		for _, e := range d.Entries {
			es = append(es, e.Key+"="+e.Value)
		}
		s := strings.Join(es, ",")
		if d.HitsAddend != nil {
			s += fmt.Sprintf(" ×%d", d.HitsAddend.Value)
		}
		parts = append(parts, s)
	}
	return fmt.Sprintf("hits_addend %d [%s]", req.HitsAddend, strings.Join(parts, "; "))
}
