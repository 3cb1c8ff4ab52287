package config

import (
	"strings"
	"testing"
	"time"
)

// TestDelayParse: "delay" is accepted on enforcing token_bucket and
// leaky_bucket rules of every backend, and refused with a reason
// everywhere else (and with "lease").
func TestDelayParse(t *testing.T) {
	ok := []struct {
		json    string
		want    Delay
		summary string
	}{
		{doc("", rule("algorithm", `"leaky_bucket"`, "burst", `1`, "delay", `{"max":"3s"}`)), Delay{3 * time.Second, DefaultMaxHeld}, "delay<=3s held<=1000/worker"},
		{doc("", rule("algorithm", `"token_bucket"`, "delay", `{"max":"250ms","max_held":5}`)), Delay{250 * time.Millisecond, 5}, "delay<=250ms held<=5/worker"},
		{doc("", rule("algorithm", `"token_bucket"`, "delay", `{"max":"1m"}`)), Delay{time.Minute, DefaultMaxHeld}, "delay<=1m"},
		{doc(redisObj, rule("backend", `"redis"`, "algorithm", `"token_bucket"`, "delay", `{"max":"1s"}`)), Delay{time.Second, DefaultMaxHeld}, "delay<=1s held<=1000/worker"},
		{doc(rlsObj, rule("backend", `"rls"`, "algorithm", `"leaky_bucket"`, "burst", `1`, "delay", `{"max":"2s","max_held":7}`)), Delay{2 * time.Second, 7}, "delay<=2s held<=7/worker"},
	}
	for _, tc := range ok {
		c, err := Parse([]byte(tc.json))
		if err != nil {
			t.Fatalf("Parse(%s): %v", tc.json, err)
		}
		if c.Rules[0].Delay != tc.want {
			t.Errorf("%s: Delay %+v, want %+v", tc.json, c.Rules[0].Delay, tc.want)
		}
		if got := c.Rules[0].Summary(); !strings.Contains(got, " "+tc.summary) {
			t.Errorf("summary %q does not contain %q", got, tc.summary)
		}
	}
	c, err := Parse([]byte(doc("", rule("algorithm", `"leaky_bucket"`))))
	if err != nil || c.Rules[0].Delay != (Delay{}) || strings.Contains(c.Rules[0].Summary(), "delay") {
		t.Fatalf("no delay: %v %+v", err, c)
	}
	bad := []struct{ name, json, want string }{
		{"fixed_window", doc("", rule("algorithm", `"fixed_window"`, "delay", `{"max":"1s"}`)), `rules[0].delay: applies only to token_bucket and leaky_bucket: fixed_window has no instant`},
		{"sliding_window", doc("", rule("algorithm", `"sliding_window"`, "delay", `{"max":"1s"}`)), `rules[0].delay: applies only to token_bucket and leaky_bucket: sliding_window has no instant`},
		{"sliding_log", doc("", rule("algorithm", `"sliding_log"`, "delay", `{"max":"1s"}`)), `rules[0].delay: applies only to token_bucket and leaky_bucket: sliding_log frees its slots`},
		{"shadow", doc("", rule("algorithm", `"token_bucket"`, "mode", `"shadow"`, "delay", `{"max":"1s"}`)), `rules[0].delay: does not apply in mode "shadow"`},
		{"redis lease", doc(redisObj, rule("backend", `"redis"`, "algorithm", `"token_bucket"`, "lease", `5`, "delay", `{"max":"1s"}`)), `rules[0].delay: does not apply with "lease"`},
		{"rls lease", doc(rlsObj, rule("backend", `"rls"`, "algorithm", `"token_bucket"`, "lease", `5`, "delay", `{"max":"1s"}`)), `rules[0].delay: does not apply with "lease"`},
		{"rls lease bad", doc(rlsObj, rule("backend", `"rls"`, "algorithm", `"token_bucket"`, "lease", `0`, "delay", `{"max":"1s"}`)), `rules[0].delay: does not apply with "lease"`},
		{"redis window", doc(redisObj, rule("backend", `"redis"`, "algorithm", `"sliding_window"`, "delay", `{"max":"1s"}`)), `rules[0].delay: applies only to token_bucket and leaky_bucket`},
		{"rls shadow", doc(rlsObj, rule("backend", `"rls"`, "algorithm", `"leaky_bucket"`, "mode", `"shadow"`, "delay", `{"max":"1s"}`)), `rules[0].delay: does not apply in mode "shadow"`},
		{"no max", doc("", rule("algorithm", `"token_bucket"`, "delay", `{}`)), `rules[0].delay.max: is required`},
		{"zero max", doc("", rule("algorithm", `"token_bucket"`, "delay", `{"max":"0s"}`)), `rules[0].delay.max: "0s" is not longer than zero`},
		{"long max", doc("", rule("algorithm", `"token_bucket"`, "delay", `{"max":"61s"}`)), `rules[0].delay.max: "61s" is longer than the maximum 1m: a held request is subject to the proxy's stream idle timeout`},
		{"number max", doc("", rule("algorithm", `"token_bucket"`, "delay", `{"max":3}`)), `rules[0].delay.max: `},
		{"max_held 0", doc("", rule("algorithm", `"token_bucket"`, "delay", `{"max":"1s","max_held":0}`)), `rules[0].delay.max_held: 0 is out of range 1..100000`},
		{"unknown field", doc("", rule("algorithm", `"token_bucket"`, "delay", `{"max":"1s","queue":3}`)), `rules[0].delay.queue: `},
		{"not an object", doc("", rule("algorithm", `"token_bucket"`, "delay", `"1s"`)), `rules[0].delay: "1s" is not an object`},
	}
	for _, tc := range bad {
		_, err := Parse([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Parse error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
