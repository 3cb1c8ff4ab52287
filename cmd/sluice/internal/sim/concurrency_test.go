package sim

import (
	"testing"
	"time"
)

func concTraffic(reqs ...[3]int64) *Traffic {
	tr := &Traffic{Start: 0, End: 10e9, Keys: []string{"a"}}
	for _, r := range reqs {
		tr.Requests = append(tr.Requests, Request{At: r[0], Key: int32(r[1]), Cost: 1})
		tr.Usage = append(tr.Usage, Usage{Actual: NoUsage, In: r[2]})
	}
	return tr
}

// Three at once on a limit of 2 (1 s each): two admitted, the third refused; one at
// 0.5 s refused; one at 1 s, when the first two end, admitted.
func TestRunConcurrencyRefuses(t *testing.T) {
	tr := concTraffic([3]int64{0, 0, 1e9}, [3]int64{0, 0, 1e9}, [3]int64{0, 0, 1e9}, [3]int64{5e8, 0, 1e9}, [3]int64{1e9, 0, 1e9})
	res, err := RunConcurrency(tr, "c", 2, Options{Buckets: 10})
	if err != nil {
		t.Fatal(err)
	}
	f := res.InFlight
	if res.Admitted != 3 || res.Denied != 2 || f.Peak != 2 || f.PeakKey != "a" || res.MaxInWindow != 2 || f.Queued != 0 {
		t.Fatalf("admitted %d denied %d peak %d queued %d", res.Admitted, res.Denied, f.Peak, f.Queued)
	}
	// Two from 0 to 1 s, one from 1 s to 2 s (the level at the end of each is carried).
	if f.ProbeKey != "a" || f.Probe[0] != 2 || f.Total[0] != 2 || f.Probe[1] != 2 || f.Probe[2] != 1 || f.Probe[3] != 0 {
		t.Fatalf("in flight per bucket %v", f.Probe)
	}
	if b, _ := WindowBound(res.Kind, res.Params); b != 2 {
		t.Fatalf("bound %d", b)
	}
}

// With a queue of 600 ms: the third waits past its delay and is refused; the one of
// 0.5 s waits 0.5 s for the slot freed at 1 s; the one of 1 s takes the other.
func TestRunConcurrencyQueues(t *testing.T) {
	tr := concTraffic([3]int64{0, 0, 1e9}, [3]int64{0, 0, 1e9}, [3]int64{0, 0, 1e9}, [3]int64{5e8, 0, 1e9}, [3]int64{1e9, 0, 1e9})
	res, err := RunConcurrency(tr, "c", 2, Options{Buckets: 10, Delay: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f := res.InFlight
	if res.Admitted != 4 || res.Denied != 1 || f.Queued != 2 || f.Expired != 1 || f.WaitMax != 500*time.Millisecond || f.Peak != 2 {
		t.Fatalf("admitted %d denied %d queued %d expired %d wait %v peak %d", res.Admitted, res.Denied, f.Queued, f.Expired, f.WaitMax, f.Peak)
	}
	// max_held 1: the 0.5 s one finds the third waiting and is refused at once.
	res, _ = RunConcurrency(tr, "c", 2, Options{Buckets: 10, Delay: 600 * time.Millisecond, MaxHeld: 1})
	if res.Admitted != 3 || res.InFlight.Queued != 1 {
		t.Fatalf("max_held 1: admitted %d queued %d", res.Admitted, res.InFlight.Queued)
	}
}
