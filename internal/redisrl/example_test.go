package redisrl_test

import (
	"fmt"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// The guest's side of one decision: build the key and the EVALSHA command,
// hand the bytes to proxy_redis_call, and parse the raw reply it gets back.
func Example() {
	key := redisrl.AppendKey(nil, algorithms.TokenBucket, "api-per-key", "203.0.113.7")
	req := &redisrl.Request{
		Kind:   algorithms.TokenBucket,
		Params: algorithms.Params{Limit: 100, Window: time.Minute, Burst: 20},
		Key:    key,
		Cost:   1,
	}
	cmd := req.AppendEvalSHA(nil) // on NOSCRIPT: req.AppendEval(nil)
	fmt.Println(string(key), len(cmd) > 0)

	// A reply as Redis sends it: admitted, 19 of 20 left, full again in
	// 600 ms.
	reply := []byte("*7\r\n:1\r\n:20\r\n:19\r\n:600000\r\n:0\r\n:1700000000000000\r\n:0\r\n")
	var d resp.Decoder
	v, err := d.Parse(reply)
	if err != nil {
		panic(err)
	}
	res, err := redisrl.ParseReply(v)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Allowed, res.Limit, res.Remaining, res.ResetAfter)
	// Output:
	// sluice:{api-per-key|203.0.113.7}:tb2 true
	// true 20 19 600ms
}
