package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	peerconfig "github.com/envoyproxy/ratelimit/src/config"
	"github.com/envoyproxy/ratelimit/src/settings"
	peerstats "github.com/envoyproxy/ratelimit/src/stats"
	gostats "github.com/lyft/gostats"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 50}, {99, 99}, {100, 100}, {1, 1}, {0.5, 1}} {
		if got := percentile(d, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile([]time.Duration{7}, 99); got != 7 {
		t.Errorf("one sample: %v", got)
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("no sample: %v", got)
	}
}

func TestSpread(t *testing.T) {
	if s := spreadOf([]float64{3, 1, 2}); s != (spread{2, 1, 3}) {
		t.Errorf("odd: %+v", s)
	}
	if s := spreadOf([]float64{4, 1, 2, 3}); s != (spread{2.5, 1, 4}) {
		t.Errorf("even: %+v", s)
	}
	if got := spreadOf([]float64{1.5, 1, 2}).format("%.2f"); got != "1.50 (1.00–2.00)" {
		t.Errorf("format: %q", got)
	}
}

func TestRedisCPU(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:0.750000\r\nused_cpu_sys_children:9.000000\r\nused_cpu_user_children:9.000000\r\n"
	if got, err := redisCPU(info); err != nil || got != 2 {
		t.Errorf("redisCPU = %v, %v; want 2", got, err)
	}
	if _, err := redisCPU("# CPU\r\nused_cpu_sys:1\r\n"); err == nil {
		t.Error("a missing used_cpu_user was accepted")
	}
	if _, err := redisCPU("used_cpu_sys:x\r\nused_cpu_user:1\r\n"); err == nil {
		t.Error("a bad number was accepted")
	}
}

func TestProcCPU(t *testing.T) {
	// A command name with a space and a parenthesis, as /proc allows.
	stat := "4242 (ratelimit (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 9 0 123 456 789"
	if got, err := procCPU(stat); err != nil || got != 22 {
		t.Errorf("procCPU = %v, %v; want 22", got, err)
	}
	if _, err := procCPU("4242 (x) S 1 2"); err == nil {
		t.Error("a short line was accepted")
	}
}

func TestParseAlgorithms(t *testing.T) {
	got, err := parseAlgorithms("token_bucket, fixed_window,sliding_log")
	if err != nil || strings.Join(got, ",") != "fixed_window,token_bucket,sliding_log" {
		t.Errorf("got %v, %v", got, err)
	}
	if _, err := parseAlgorithms("gcra"); err == nil {
		t.Error("an unknown algorithm was accepted")
	}
}

// loadPeerConfig loads a configuration with envoyproxy/ratelimit's own loader,
// which panics with a RateLimitConfigError on a bad file.
func loadPeerConfig(yaml []byte) (cfg peerconfig.RateLimitConfig, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	mgr := peerstats.NewStatManager(gostats.NewStore(gostats.NewNullSink(), false), settings.Settings{})
	y := peerconfig.ConfigFileContentToYaml("bench.yaml", string(yaml))
	return peerconfig.NewRateLimitConfigImpl([]peerconfig.RateLimitConfigToLoad{{Name: "bench.yaml", ConfigYaml: y}}, mgr, false), nil
}

// The peer's configuration is one envoyproxy/ratelimit loads, with the
// limits the report states; sluice's starts with exactly the same file (the
// drop-in claim) and adds per-algorithm descriptors the peer would reject.
func TestConfigs(t *testing.T) {
	peer, sluice := configs(domain)
	cfg, err := loadPeerConfig(peer)
	if err != nil {
		t.Fatalf("envoyproxy/ratelimit rejects the peer configuration: %v\n%s", err, peer)
	}
	for _, v := range variants {
		d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: v.key, Value: "u1"}}}
		l := cfg.GetLimit(context.Background(), domain, d)
		if l == nil {
			t.Fatalf("%s: no limit", v.key)
		}
		unit := map[string]rlsv3.RateLimitResponse_RateLimit_Unit{"second": rlsv3.RateLimitResponse_RateLimit_SECOND,
			"minute": rlsv3.RateLimitResponse_RateLimit_MINUTE, "day": rlsv3.RateLimitResponse_RateLimit_DAY}[v.unit]
		if l.Limit.GetRequestsPerUnit() != uint32(v.limit) || l.Limit.GetUnit() != unit {
			t.Errorf("%s: limit %v, want %d per %s", v.key, l.Limit, v.limit, v.unit)
		}
	}
	if !bytes.HasPrefix(sluice, peer) {
		t.Errorf("sluice's configuration does not start with the peer's:\n%s\n---\n%s", peer, sluice)
	}
	for _, a := range algorithmNames[1:] {
		for _, v := range variants {
			if !bytes.Contains(sluice, []byte("- key: "+descriptorKey(v.key, a)+"\n")) || !bytes.Contains(sluice, []byte("algorithm: "+a+"\n")) {
				t.Errorf("no %s descriptor for %s", a, v.key)
			}
		}
	}
	if _, err := loadPeerConfig(sluice); err == nil || !strings.Contains(err.Error(), "algorithm") {
		t.Errorf("the peer accepted rate_limit.algorithm (err %v): the comparison would not need two files", err)
	}
}

func TestCommandStats(t *testing.T) {
	into := map[string]cmdStat{"evalsha": {calls: 1, usec: 2}}
	info := "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=300,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\ncmdstat_incrby:calls=5,usec=10,usec_per_call=2.00\r\n"
	if err := commandStats(info, into); err != nil {
		t.Fatal(err)
	}
	if into["evalsha"] != (cmdStat{11, 302}) || into["incrby"] != (cmdStat{5, 10}) || len(into) != 2 {
		t.Errorf("got %v", into)
	}
	if err := commandStats("cmdstat_get:calls=x,usec=1\r\n", into); err == nil {
		t.Error("a bad number was accepted")
	}
}

func TestIOStatsAndCommandTime(t *testing.T) {
	r, w, err := ioStats("# Stats\r\ntotal_reads_processed:120\r\ntotal_writes_processed:80\r\n")
	if err != nil || r != 120 || w != 80 {
		t.Fatalf("ioStats = %d, %d, %v", r, w, err)
	}
	if _, _, err := ioStats("total_reads_processed:1\r\n"); err == nil {
		t.Error("ioStats without writes: no error")
	}
	// A script's usec includes the commands it calls: only EVALSHA counts.
	if got := commandTime(map[string]cmdStat{"evalsha": {10, 300}, "get": {10, 50}, "set": {5, 40}}); got != 300 {
		t.Errorf("commandTime with a script = %d, want 300", got)
	}
	if got := commandTime(map[string]cmdStat{"incrby": {10, 30}, "expire": {10, 20}}); got != 50 {
		t.Errorf("commandTime of plain commands = %d, want 50", got)
	}
}
