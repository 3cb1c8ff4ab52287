package filtertest

// HigressScopes is what Higress's controller makes of a WasmPlugin with defaultConfig and
// three matchRules (ingress, domain, service), in its order: route level first.
const HigressScopes = `{
  "rules": [{"name": "global", "key": [{"remote_ip": true}], "algorithm": "fixed_window", "limit": 3, "window": "1h"}],
  "_rules_": [
    {"_match_route_": ["default/checkout", "default/cart"], "scope": "shop",
     "rules": [{"name": "per-ip", "key": [{"remote_ip": true}], "algorithm": "fixed_window", "limit": 1, "window": "1h"}],
     "response": {"status": 503, "body": "shop closed\n", "headers": "draft"}},
    {"_match_domain_": ["*.example.com"],
     "rules": [{"name": "per-ip", "key": [{"remote_ip": true}], "algorithm": "fixed_window", "limit": 2, "window": "1h"}]},
    {"_match_service_": ["health.default.svc.cluster.local:8080"], "rules": []}
  ]
}`
