package config_test

import (
	"fmt"

	"github.com/sluice-proxy/sluice/config"
)

func ExampleParse() {
	c, err := config.Parse([]byte(`{
	  "rules": [{
	    "name": "login-per-ip",
	    "match": {"path_prefix": "/login", "methods": ["POST"]},
	    "key": [{"remote_ip": true, "ipv6_prefix": 64}],
	    "algorithm": "sliding_window", "limit": 5, "window": "15m"
	  }]
	}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	r := c.Rules[0]
	fmt.Println(r.Summary())
	fmt.Println(r.Match.Matches("POST", "/login?next=/", nil), r.Match.Matches("GET", "/login", nil))
	// Output:
	// login-per-ip: sliding_window 5/15m key=remote_ip/64 match=path_prefix:/login methods:POST local enforce
	// true false
}

func ExampleParse_errors() {
	_, err := config.Parse([]byte(`{
	  "rules": [{"name": "a", "key": [], "algorithm": "token_bucket", "limit": 10, "window": "10x"}],
	  "failure_mode": "fail_open"
	}`))
	fmt.Println(err)
	// Output:
	// rules[0].key: must not be empty
	// rules[0].window: "10x" is not a duration
	// failure_mode: "fail_open" is not one of open, closed, local
}
