package algorithms_test

import (
	"fmt"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

func Example() {
	l, err := algorithms.New(algorithms.TokenBucket, algorithms.Params{Limit: 2, Window: time.Second})
	if err != nil {
		panic(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	buf := make([]byte, 0, l.MaxStateSize()) // reused: Decide allocates nothing
	var state []byte                         // empty: a key never seen
	for _, at := range []time.Duration{0, 0, 0, 500 * time.Millisecond} {
		out, d, err := l.Decide(buf[:0], state, t0+int64(at), 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%v: allowed=%v remaining=%d retry-after=%v\n", at, d.Allowed, d.Remaining, d.RetryAfter)
		if d.Allowed {
			state = append(state[:0], out...) // store the new state (shared data, Redis, ...)
		}
	}
	// Output:
	// 0s: allowed=true remaining=1 retry-after=0s
	// 0s: allowed=true remaining=0 retry-after=0s
	// 0s: allowed=false remaining=0 retry-after=500ms
	// 500ms: allowed=true remaining=0 retry-after=0s
}

func ExampleNew_error() {
	_, err := algorithms.New(algorithms.SlidingLog, algorithms.Params{Limit: 50000, Window: time.Minute})
	fmt.Println(err)
	// Output: limit must be at most 10000 for sliding_log
}
