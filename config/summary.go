package config

import (
	"strconv"
	"strings"

	"github.com/sluice-proxy/sluice/algorithms"
)

// String returns the configuration name ("local", "redis").
func (b Backend) String() string { return enumName(backendNames[:], int(b)) }

// String returns the configuration name ("enforce", "shadow").
func (m Mode) String() string { return enumName(modeNames[:], int(m)) }

// String returns the configuration name of m ("skip", "shared", "deny").
func (m MissingKey) String() string { return enumName(missingKeyNames[:], int(m)) }

// String returns the configuration name ("open", "closed", "local").
func (f FailureMode) String() string { return enumName(failureModeNames[:], int(f)) }

// String returns the configuration name ("both", "draft", "legacy", "none").
func (h HeaderStyle) String() string { return enumName(headerStyleNames[:], int(h)) }

func enumName(names []string, i int) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return "unknown(" + strconv.Itoa(i) + ")"
}

// noCut is a plainText limit that never cuts: names and values in a Summary
// are shown whole (quoted and escaped when they are not plain).
const noCut = MaxConfigSize * 10

// String describes the key part as in a Summary: "remote_ip",
// "remote_ip/64", "header:x-api-key", "query:k", "cookie:session", "path",
// "method"; a name that is not plain printable ASCII is quoted
// ("query:\"a b\"").
func (k KeyPart) String() string {
	switch {
	case k.RemoteIP && k.IPv6Prefix > 0:
		return "remote_ip/" + strconv.Itoa(k.IPv6Prefix)
	case k.RemoteIP:
		return "remote_ip"
	case k.Header != "":
		return "header:" + plainText(k.Header, noCut)
	case k.Query != "":
		return "query:" + plainText(k.Query, noCut)
	case k.Cookie != "":
		return "cookie:" + plainText(k.Cookie, noCut)
	case k.Path:
		return "path"
	case k.Method:
		return "method"
	case !k.Value.IsZero():
		return k.Value.String()
	}
	return "none"
}

// String describes the match as in a Summary: "all", or space-separated
// "path_prefix:/api/", "methods:GET,POST", "header:x-tenant=acme".
func (m *Match) String() string {
	if m.IsZero() {
		return "all"
	}
	var parts []string
	if m.PathPrefix != "" {
		parts = append(parts, "path_prefix:"+plainText(m.PathPrefix, noCut))
	}
	if len(m.Methods) > 0 {
		parts = append(parts, "methods:"+strings.Join(m.Methods, ","))
	}
	for _, h := range m.Headers {
		if h.Absent {
			parts = append(parts, "header:"+plainText(h.Name, noCut)+":absent")
			continue
		}
		parts = append(parts, "header:"+plainText(h.Name, noCut)+"="+strconv.Quote(h.Exact))
	}
	if len(m.Routes) > 0 {
		parts = append(parts, "routes:"+plainList(m.Routes))
	}
	parts = append(parts, m.valuesString()...) // metadata.go
	return strings.Join(parts, " ")
}

// Summary describes the rule on one line, e.g.
//
//	api-per-key: token_bucket 100/1m burst 20 key=header:x-api-key match=path_prefix:/api/ methods:GET,POST local enforce
//
// "burst N" appears for token_bucket and leaky_bucket only, "missing_key=M"
// only when it is not skip, "max_keys=N" only
// when it is not DefaultMaxKeys, "lease=N" only when the rule has a lease.
func (r *Rule) Summary() string {
	var b strings.Builder
	b.WriteString(r.Name)
	b.WriteString(": ")
	b.WriteString(r.Algorithm.String())
	b.WriteByte(' ')
	b.WriteString(strconv.FormatInt(r.Limit, 10))
	if r.Concurrency != nil {
		r.concurrencySummary(&b)
	} else {
		b.WriteByte('/')
		b.WriteString(FormatDuration(r.Window))
	}
	if r.Algorithm == algorithms.TokenBucket || r.Algorithm == algorithms.LeakyBucket {
		b.WriteString(" burst ")
		b.WriteString(strconv.FormatInt(r.Burst, 10))
	}
	b.WriteString(" key=")
	for i, k := range r.Key {
		if i > 0 {
			b.WriteByte('+')
		}
		b.WriteString(k.String())
	}
	if r.MissingKey != MissingSkip {
		b.WriteString(" missing_key=")
		b.WriteString(r.MissingKey.String())
	}
	if r.Plans != nil {
		b.WriteString(" " + r.Plans.tableString("plans")) // plans.go
	}
	if r.Overrides != nil {
		b.WriteString(" " + r.Overrides.tableString("overrides"))
	}
	b.WriteString(" match=")
	b.WriteString(r.Match.String())
	b.WriteByte(' ')
	b.WriteString(r.Backend.String())
	b.WriteByte(' ')
	b.WriteString(r.Mode.String())
	if r.MaxKeys != DefaultMaxKeys {
		b.WriteString(" max_keys=")
		b.WriteString(strconv.Itoa(r.MaxKeys))
	}
	if r.Lease > 0 {
		b.WriteString(" lease=")
		b.WriteString(strconv.FormatInt(r.Lease, 10))
	}
	if r.Cost != nil {
		b.WriteByte(' ')
		b.WriteString(r.Cost.String())
	}
	if r.Delay.Max > 0 && r.Concurrency != nil {
		b.WriteString(" queue<=")
		b.WriteString(FormatDuration(r.Delay.Max))
		b.WriteString(" queued<=")
		b.WriteString(strconv.Itoa(r.Delay.MaxHeld))
		b.WriteString("/worker")
	} else if r.Delay.Max > 0 {
		b.WriteString(" delay<=")
		b.WriteString(FormatDuration(r.Delay.Max))
		b.WriteString(" held<=")
		b.WriteString(strconv.Itoa(r.Delay.MaxHeld))
		b.WriteString("/worker")
	}
	return b.String()
}
