package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckExplain(t *testing.T) {
	f := filepath.Join(t.TempDir(), "plans.json")
	os.WriteFile(f, []byte(`{"rules":[
	  {"name":"api","match":{"path_prefix":"/api/"},"key":[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}}],
	   "algorithm":"token_bucket","limit":100,"window":"1m",
	   "plans":{"by":{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.plan"}},"values":{"free":10,"pro":{"limit":1000,"burst":50}},"default":"free"},
	   "overrides":{"by":{"header":"x-api-key"},"values":{"acme":5000}}},
	  {"name":"login","match":{"path_prefix":"/login"},"key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":5,"window":"15m","count":{"status":[401]}}]}`), 0o644)
	const jwt = "metadata:envoy.filters.http.jwt_authn:payload."
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"path=/api/x", jwt + "sub=alice", jwt + "plan=pro"}, []string{
			`explain GET /api/x:`,
			`  api: applies, key metadata:envoy.filters.http.jwt_authn:payload.sub="alice", 1000/1m burst 50 (plan "pro")`,
			`  login: does not apply (match)`}},
		{[]string{"path=/api/x", jwt + "sub=alice", jwt + "plan=pro", "header:X-Api-Key=acme"}, []string{
			`  api: applies, key metadata:envoy.filters.http.jwt_authn:payload.sub="alice", 5000/1m burst 5000 (override "acme")`}},
		{[]string{"path=/api/x", jwt + "sub=bob"}, []string{
			`  api: applies, key metadata:envoy.filters.http.jwt_authn:payload.sub="bob", 10/1m burst 10 (default plan "free")`}},
		{[]string{"path=/api/x"}, []string{
			`  api: key part metadata:envoy.filters.http.jwt_authn:payload.sub missing: missing_key skip`}},
		{[]string{"method=POST", "path=/login", "header:x-user=eve"}, []string{
			`  login: applies, key header:x-user="eve", 5/15m burst 5 (rule's own)`}},
	} {
		var args []string
		for _, a := range c.args {
			args = append(args, "--explain", a)
		}
		var out, errOut bytes.Buffer
		if code := runCheck(append(args, f), &out, &errOut); code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, errOut.String())
		}
		for _, w := range c.want {
			if !strings.Contains(out.String(), w+"\n") {
				t.Errorf("%v: output lacks %q:\n%s", c.args, w, out.String())
			}
		}
	}
	var out, errOut bytes.Buffer
	if code := runCheck([]string{"--explain", "nonsense", f}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "want KIND=VALUE") {
		t.Errorf("bad sample: %d %q", code, errOut.String())
	}
}
