package e2e

// keyless: requests that omit the key of a per-key rule (rules[].missing_key, and a
// match.headers entry with "absent"). One rule per path, each keyed on X-Api-Key with 2
// requests per hour:
//   - /skip/ (missing_key "skip", the default): keyless requests are not limited at all,
//     which is how a client escapes a per-key limit by omitting the key;
//   - /shared/ ("shared"): every keyless request (header absent or empty) is counted under
//     one key of the rule, apart from every real key;
//   - /deny/ ("deny"): keyless requests are refused with the rule's response, Retry-After
//     the window (3600), remaining 0;
//   - /absent/: the per-key rule skips keyless requests, and a second rule that matches
//     only requests without X-Api-Key limits them per client address (1 per hour).
func keyless() Scenario {
	perKey := func(name, prefix, missing string) string {
		return `{"name":"` + name + `","match":{"path_prefix":"` + prefix + `"},"key":[{"header":"x-api-key"}]` + missing +
			`,"algorithm":"fixed_window","limit":2,"window":"1h"}`
	}
	remaining := func(status int, n string) Expect {
		return Expect{Status: status, Header: map[string]Check{hRemaining: Exact(n), hLimit: Exact("2")}}
	}
	denied := Expect{Status: 429, Body: "rate limited\n", Header: map[string]Check{
		hRetryAfter: Exact("3600"), hRemaining: Exact("0"), hLimit: Exact("2"), hReset: Exact("3600")}}
	return Scenario{
		Name: "keyless",
		Config: `{"rules":[` +
			perKey("skip", "/skip/", "") + `,` +
			perKey("shared", "/shared/", `,"missing_key":"shared"`) + `,` +
			perKey("deny", "/deny/", `,"missing_key":"deny"`) + `,` +
			perKey("per-key", "/absent/", "") + `,` +
			`{"name":"keyless","match":{"path_prefix":"/absent/","headers":[{"name":"x-api-key","absent":true}]},
			  "key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}],
 "response":{"headers":"legacy"}}`,
		Steps: []Step{
			{Desc: "skip: keyless requests are not limited", Req: get("/skip/x"), Times: 6, Want: Expect{Status: 200, Header: noRateLimitHeaders()}},
			{Desc: "skip: an empty key is no key", Req: get("/skip/x", "X-Api-Key", ""), Times: 3, Want: Expect{Status: 200, Header: noRateLimitHeaders()}},
			{Desc: "skip: key a (1)", Req: get("/skip/x", "X-Api-Key", "a"), Want: remaining(200, "1")},
			{Desc: "skip: key a (2)", Req: get("/skip/x", "X-Api-Key", "a"), Want: remaining(200, "0")},
			{Desc: "skip: key a limited", Req: get("/skip/x", "X-Api-Key", "a"), Want: remaining(429, "0")},

			{Desc: "shared: keyless (1)", Req: get("/shared/x"), Want: remaining(200, "1")},
			{Desc: "shared: keyless with an empty key (2), the same key", Req: get("/shared/x", "X-Api-Key", ""), Want: remaining(200, "0")},
			{Desc: "shared: keyless requests are limited together", Req: get("/shared/x"), Times: 4, Want: remaining(429, "0")},
			{Desc: "shared: key a has its own bucket", Req: get("/shared/x", "X-Api-Key", "a"), Want: remaining(200, "1")},

			{Desc: "deny: keyless refused", Req: get("/deny/x"), Times: 3, Want: denied},
			{Desc: "deny: an empty key refused", Req: get("/deny/x", "X-Api-Key", ""), Want: denied},
			{Desc: "deny: key a (1)", Req: get("/deny/x", "X-Api-Key", "a"), Want: remaining(200, "1")},
			{Desc: "deny: key a (2)", Req: get("/deny/x", "X-Api-Key", "a"), Want: remaining(200, "0")},
			{Desc: "deny: key a limited", Req: get("/deny/x", "X-Api-Key", "a"), Want: remaining(429, "0")},

			{Desc: "absent: keyed requests are the per-key rule's only", Req: get("/absent/x", "X-Api-Key", "b"), Want: remaining(200, "1")},
			{Desc: "absent: the keyless rule catches a request without the header",
				Req: get("/absent/x"), Want: Expect{Status: 200, Header: map[string]Check{hRemaining: Exact("0"), hLimit: Exact("1")}}},
			{Desc: "absent: the next keyless request is limited",
				Req: get("/absent/x"), Times: 3, Want: Expect{Status: 429, Header: map[string]Check{hRemaining: Exact("0"), hLimit: Exact("1"), hRetryAfter: IntIn(1, 3600)}}},
			{Desc: "absent: keyed requests go on", Req: get("/absent/x", "X-Api-Key", "b"), Want: remaining(200, "0")},
		},
	}
}
