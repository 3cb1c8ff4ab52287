package host

import (
	"sync"
	"testing"
	"time"
)

// An extension call's outcome (Guest.Start's deliver, e.g. a Redis reply) is taken by the
// worker before the jobs queued ahead of it: new requests queued while a reply waits do not
// delay the requests the reply completes.
func TestReplyBeforeQueuedJobs(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1})
	w := h.workers[0]
	var mu sync.Mutex
	var order []string
	record := func(s string) job {
		return job{fn: func(*worker) { mu.Lock(); order = append(order, s); mu.Unlock() }}
	}
	release := make(chan struct{})
	w.postAsync(job{fn: func(*worker) { <-release }}) // the worker is busy
	for i := 0; i < 3; i++ {
		w.postAsync(record("job"))
	}
	w.postReply(record("reply"))
	close(release)
	ran := func() int { mu.Lock(); defer mu.Unlock(); return len(order) }
	if !pollFor(10*time.Second, func() bool { return ran() == 4 }) {
		t.Fatalf("ran %d of 4 jobs", ran())
	}
	if order[0] != "reply" {
		t.Fatalf("order %v: the reply ran after jobs queued before it", order)
	}
}
