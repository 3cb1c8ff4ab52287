package config

import (
	"strings"
	"testing"
	"time"
)

const observeRule = `"rules":[{"name":"r","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":5,"window":"1m"}]`

func TestObserveOptions(t *testing.T) {
	c, err := Parse([]byte(`{` + observeRule + `,"access_log":{"key":"raw","near_limit_percent":0},
	  "top_keys":{"size":16,"key":"hashed","log_every":"30s","log_top":3},
	  "response":{"rule_header":"X-Sluice-Rule","format":"problem_json"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if a := c.AccessLog; a == nil || a.Key != KeyRaw || a.NearLimitPercent != 0 {
		t.Errorf("access_log %+v", a)
	}
	if tk := c.TopKeys; tk == nil || tk.Size != 16 || tk.Key != KeyHashed || tk.LogEvery != 30*time.Second || tk.LogTop != 3 {
		t.Errorf("top_keys %+v", tk)
	}
	if r := c.Response; r.RuleHeader != "x-sluice-rule" || r.ContentType != ProblemJSONContentType || r.Template == nil {
		t.Errorf("response %+v", r)
	}
	c, err = Parse([]byte(`{` + observeRule + `,"access_log":{},"top_keys":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.AccessLog.Key != KeyHashed || c.AccessLog.NearLimitPercent != DefaultNearLimitPercent || c.TopKeys.Size != DefaultTopKeysSize || c.TopKeys.LogEvery != 0 {
		t.Errorf("defaults: %+v %+v", c.AccessLog, c.TopKeys)
	}
	c, _ = Parse([]byte(`{` + observeRule + `}`))
	if c.AccessLog != nil || c.TopKeys != nil || c.Response.RuleHeader != "" || c.Response.Template != nil {
		t.Errorf("off by default: %+v %+v %+v", c.AccessLog, c.TopKeys, c.Response)
	}
}

func TestObserveErrors(t *testing.T) {
	for _, tc := range []struct{ extra, want string }{
		{`"access_log":{"key":"plain"}`, `access_log.key: "plain" is not one of hashed, raw, none`},
		{`"access_log":{"near_limit_percent":101}`, `access_log.near_limit_percent: 101 is out of range 0..100`},
		{`"access_log":true`, `access_log: true is not an object`},
		{`"top_keys":{"size":2}`, `top_keys.size: 2 is out of range 4..1024`},
		{`"top_keys":{"key":"none"}`, `top_keys.key: "none" is not one of hashed, raw`},
		{`"top_keys":{"log_every":"500ms"}`, `top_keys.log_every: "500ms" is shorter than the minimum 1s`},
		{`"top_keys":{"log_top":3}`, `top_keys.log_top: applies only with "log_every"`},
		{`"top_keys":{"size":8,"log_every":"1m","log_top":9}`, `top_keys.log_top: 9 is out of range 1..8`},
		{`"response":{"rule_header":":status"}`, `response.rule_header: ":status" is a pseudo-header`},
		{`"response":{"rule_header":"a b"}`, `response.rule_header: "a b" is not a header name`},
		{`"response":{"format":"json"}`, `response.format: "json" is not one of text, problem_json, template`},
		{`"response":{"format":"problem_json","body":"x"}`, `response.body: does not apply with "format": "problem_json"`},
		{`"response":{"content_type":"a/b"}`, `response.content_type: applies only with "format": "template"`},
		{`"response":{"format":"template","content_type":"a\nb"}`, `response.content_type: "a\nb" is not 1-256 printable ASCII characters`},
	} {
		_, err := Parse([]byte(`{` + observeRule + `,` + tc.extra + `}`))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.extra, err, tc.want)
		}
	}
}

func TestCompileTemplate(t *testing.T) {
	tm := CompileTemplate(`{"a":{rule},"b":"{x}{limit}}{`)
	if len(tm.Lit) != 3 || tm.Lit[0] != `{"a":` || tm.Lit[1] != `,"b":"{x}` || tm.Lit[2] != `}{` || tm.Vars[0] != 0 || tm.Vars[1] != 1 {
		t.Fatalf("%q %v", tm.Lit, tm.Vars)
	}
}
