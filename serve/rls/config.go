package rls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v2"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
)

// Config is a set of envoyproxy/ratelimit domain configurations, read from
// its YAML format unchanged (one domain per document), plus two sluice keys
// in rate_limit: algorithm (default fixed_window, so an existing file
// behaves as it did) and burst. It is immutable once loaded.
type Config struct {
	domains map[string]*node
	files   []string
}

// Limit is one configured (or overriding) limit.
type Limit struct {
	Name            string
	Unit            pb.RateLimitResponse_RateLimit_Unit
	RequestsPerUnit uint32
	Unlimited       bool
	Shadow          bool
	Quota           bool
	Detailed        bool
	Replaces        []string
	Kind            algorithms.Kind
	// Params are normalised by algorithms.New; Limit 0 (requests_per_unit
	// 0) denies every request without asking Redis.
	Params algorithms.Params
	// Metadata is the descriptor's metadata, returned in the response's
	// dynamic metadata when the descriptor passes (Options.DynamicMetadata).
	Metadata *structpb.Struct
	// key is the envoyproxy/ratelimit "full key" (domain.key_value...),
	// the metric name of the limit.
	key string
}

type node struct {
	children  map[string]*node // by "key" or "key_value"
	wildcards []wildcard       // in file order
	limit     *Limit
	share     string // share_threshold: the wildcard value shared by every match
	detailed  bool
	valueTo   bool // value_to_metric: the request's value goes into the stat key
}

type wildcard struct {
	key   string   // the children key ("key_val*ue")
	parts []string // split on '*'
}

// The keys envoyproxy/ratelimit accepts (config_impl.go validKeys), plus
// algorithm and burst. Any other key is an error, as there.
var validKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true, "unit": true,
	"requests_per_unit": true, "unlimited": true, "shadow_mode": true, "quota_mode": true, "name": true,
	"replaces": true, "detailed_metric": true, "value_to_metric": true, "share_threshold": true, "metadata": true,
	"algorithm": true, "burst": true,
}

type yamlRoot struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit"`
	Descriptors    []yamlDescriptor `yaml:"descriptors"`
	ShadowMode     bool             `yaml:"shadow_mode"`
	QuotaMode      bool             `yaml:"quota_mode"`
	DetailedMetric bool             `yaml:"detailed_metric"`
	ValueToMetric  bool             `yaml:"value_to_metric"`
	ShareThreshold bool             `yaml:"share_threshold"`
	Metadata       map[string]any   `yaml:"metadata"`
}

type yamlRateLimit struct {
	RequestsPerUnit uint32 `yaml:"requests_per_unit"`
	Unit            string `yaml:"unit"`
	Unlimited       bool   `yaml:"unlimited"`
	Name            string `yaml:"name"`
	Replaces        []struct {
		Name string `yaml:"name"`
	} `yaml:"replaces"`
	Algorithm string `yaml:"algorithm"`
	Burst     int64  `yaml:"burst"`
}

// ConfigOptions change how documents are combined.
type ConfigOptions struct {
	// MergeDomains lets several documents configure one domain, their
	// descriptors merged (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); a
	// composite key defined twice is still an error. Without it, two
	// documents with one domain are an error.
	MergeDomains bool
}

// ParseConfig parses configuration documents; names[i] names data[i] in
// errors. Two documents with one domain are an error (envoyproxy/ratelimit
// without MERGE_DOMAIN_CONFIG).
func ParseConfig(names []string, data [][]byte) (*Config, error) {
	return ParseConfigWith(names, data, ConfigOptions{})
}

// ParseConfigWith is ParseConfig with options.
func ParseConfigWith(names []string, data [][]byte, opts ConfigOptions) (*Config, error) {
	c := &Config{domains: map[string]*node{}, files: append([]string(nil), names...)}
	for i := range data {
		if err := c.load(data[i], opts); err != nil {
			return nil, fmt.Errorf("%s: %w", names[i], err)
		}
	}
	return c, nil
}

// LoadConfig reads a configuration file, or every *.yaml / *.yml file of a
// directory (not descending, dot files skipped, in name order), each one
// domain: envoyproxy/ratelimit's RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config
// layout is such a directory.
func LoadConfig(path string) (*Config, error) { return LoadConfigWith(path, ConfigOptions{}) }

// LoadConfigWith is LoadConfig with options.
func LoadConfigWith(path string, opts ConfigOptions) (*Config, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	files := []string{path}
	if st.IsDir() {
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		files = files[:0]
		for _, e := range ents {
			n := e.Name()
			if e.IsDir() || strings.HasPrefix(n, ".") || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
				continue
			}
			files = append(files, filepath.Join(path, n))
		}
		sort.Strings(files)
		if len(files) == 0 {
			return nil, fmt.Errorf("%s: no .yaml or .yml file", path)
		}
	}
	data := make([][]byte, len(files))
	for i, f := range files {
		if data[i], err = os.ReadFile(f); err != nil {
			return nil, err
		}
	}
	return ParseConfigWith(files, data, opts)
}

// Domains returns the configured domains, sorted.
func (c *Config) Domains() []string {
	var d []string
	for k := range c.domains {
		d = append(d, k)
	}
	sort.Strings(d)
	return d
}

// Summary returns one line per configured limit, in key order: its full
// key, then "unlimited" or "<n> per <unit> <algorithm>" with its burst and
// flags (shadow_mode, quota_mode, name, replaces).
func (c *Config) Summary() []string {
	var out []string
	c.eachLimit(func(key string, l *Limit) {
		line := key + ": "
		if l.Unlimited {
			line += "unlimited"
		} else {
			line += fmt.Sprintf("%d per %s %s", l.RequestsPerUnit, strings.ToLower(l.Unit.String()), l.Kind)
			if l.Params.Burst != l.Params.Limit {
				line += fmt.Sprintf(" burst %d", l.Params.Burst)
			}
		}
		for _, f := range []struct {
			on   bool
			text string
		}{{l.Shadow, "shadow_mode"}, {l.Quota, "quota_mode"}, {l.Name != "", "name " + l.Name},
			{len(l.Replaces) > 0, "replaces " + strings.Join(l.Replaces, ",")}} {
			if f.on {
				line += ", " + f.text
			}
		}
		out = append(out, line)
	})
	return out
}

// eachLimit calls f with the full key (domain.k1_v1.k2…) of every configured limit, by
// domain and then key order, a parent before its children.
func (c *Config) eachLimit(f func(key string, l *Limit)) {
	var walk func(prefix string, n *node)
	walk = func(prefix string, n *node) {
		keys := make([]string, 0, len(n.children))
		for k := range n.children {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ch := n.children[k]
			if ch.limit != nil {
				f(prefix+k, ch.limit)
			}
			walk(prefix+k+".", ch)
		}
	}
	for _, d := range c.Domains() {
		walk(d+".", c.domains[d])
	}
}

// Files returns the files the configuration was read from.
func (c *Config) Files() []string { return c.files }

func (c *Config) load(data []byte, opts ConfigOptions) error {
	// The YAML library envoyproxy/ratelimit decodes with (yaml.v2), so that
	// scalars read the same: "value: 010" is the string "010", "key: n" is "n".
	var generic map[any]any
	if err := yaml.Unmarshal(data, &generic); err != nil {
		return fmt.Errorf("error loading config file: %w", err)
	}
	if err := checkKeys(generic); err != nil {
		return err
	}
	var root yamlRoot
	if err := yaml.Unmarshal(data, &root); err != nil {
		return fmt.Errorf("error loading config file: %w", err)
	}
	if root.Domain == "" {
		return errors.New("config file cannot have empty domain")
	}
	d := root.Domain
	if n, dup := c.domains[d]; dup {
		if !opts.MergeDomains {
			return fmt.Errorf("duplicate domain '%s' in config file", d)
		}
		return n.loadDescriptors(d+".", root.Descriptors)
	}
	n := &node{children: map[string]*node{}}
	if err := n.loadDescriptors(d+".", root.Descriptors); err != nil {
		return err
	}
	c.domains[d] = n
	return nil
}

// checkKeys refuses unknown keys at any level (metadata's contents are
// free), as envoyproxy/ratelimit's validateYamlKeys does.
func checkKeys(v any) error {
	switch v := v.(type) {
	case map[any]any:
		for k, x := range v {
			ks, ok := k.(string)
			if !ok {
				return fmt.Errorf("config error, key is not of type string: %v", k)
			}
			if !validKeys[ks] {
				return fmt.Errorf("config error, unknown key '%s'", ks)
			}
			if ks == "metadata" {
				continue
			}
			if err := checkKeys(x); err != nil {
				return err
			}
		}
	case []any:
		for _, x := range v {
			if _, ok := x.(map[any]any); !ok {
				return fmt.Errorf("config error, yaml file contains list of type other than map: %v", x)
			}
			if err := checkKeys(x); err != nil {
				return err
			}
		}
	}
	return nil
}

// unitWindow is the window of each unit (envoyproxy/ratelimit's
// UnitToDivider: a month is 30 days, a year 365).
func unitWindow(u pb.RateLimitResponse_RateLimit_Unit) time.Duration {
	const day = 24 * time.Hour
	switch u {
	case pb.RateLimitResponse_RateLimit_SECOND:
		return time.Second
	case pb.RateLimitResponse_RateLimit_MINUTE:
		return time.Minute
	case pb.RateLimitResponse_RateLimit_HOUR:
		return time.Hour
	case pb.RateLimitResponse_RateLimit_DAY:
		return day
	case pb.RateLimitResponse_RateLimit_WEEK:
		return 7 * day
	case pb.RateLimitResponse_RateLimit_MONTH:
		return 30 * day
	case pb.RateLimitResponse_RateLimit_YEAR:
		return 365 * day
	}
	return 0
}

func (n *node) loadDescriptors(parent string, ds []yamlDescriptor) error {
	for _, d := range ds {
		if d.Key == "" {
			return errors.New("descriptor has empty key")
		}
		final := d.Key
		if d.Value != "" {
			final += "_" + d.Value
		}
		full := parent + final
		if _, dup := n.children[final]; dup {
			return fmt.Errorf("duplicate descriptor composite key '%s'", full)
		}
		child := &node{children: map[string]*node{}, detailed: d.DetailedMetric, valueTo: d.ValueToMetric}
		if rl := d.RateLimit; rl != nil {
			l, err := newLimit(full, rl, &d)
			if err != nil {
				return fmt.Errorf("descriptor '%s': %w", full, err)
			}
			child.limit = l
		}
		if d.ShareThreshold {
			if !strings.Contains(final, "*") {
				return fmt.Errorf("share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", final)
			}
			child.share = strings.TrimPrefix(final, d.Key+"_")
		}
		if strings.Contains(final, "*") {
			n.wildcards = append(n.wildcards, wildcard{key: final, parts: strings.Split(final, "*")})
		}
		if err := child.loadDescriptors(full+".", d.Descriptors); err != nil {
			return err
		}
		n.children[final] = child
	}
	return nil
}

func newLimit(full string, rl *yamlRateLimit, d *yamlDescriptor) (*Limit, error) {
	u, ok := pb.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(rl.Unit)]
	valid := ok && u != int32(pb.RateLimitResponse_RateLimit_UNKNOWN)
	l := &Limit{
		Name: rl.Name, Unit: pb.RateLimitResponse_RateLimit_Unit(u), RequestsPerUnit: rl.RequestsPerUnit,
		Unlimited: rl.Unlimited, Shadow: d.ShadowMode, Quota: d.QuotaMode, Detailed: d.DetailedMetric, key: full,
	}
	if len(d.Metadata) > 0 {
		md, err := metadataStruct(d.Metadata)
		if err != nil {
			return nil, fmt.Errorf("metadata: %w", err)
		}
		l.Metadata = md
	}
	if rl.Unlimited {
		if valid {
			return nil, errors.New("should not specify rate limit unit when unlimited")
		}
	} else if !valid {
		return nil, fmt.Errorf("invalid rate limit unit '%s'", rl.Unit)
	}
	for _, r := range rl.Replaces {
		if r.Name == "" {
			return nil, errors.New("should not have an empty replaces entry")
		}
		if r.Name == rl.Name {
			return nil, errors.New("replaces should not contain name of same descriptor")
		}
		l.Replaces = append(l.Replaces, r.Name)
	}
	if rl.Unlimited {
		return l, nil
	}
	l.Kind = algorithms.FixedWindow
	if rl.Algorithm != "" {
		if l.Kind, ok = algorithms.ParseKind(rl.Algorithm); !ok {
			return nil, fmt.Errorf("unknown algorithm '%s' (token_bucket, leaky_bucket, fixed_window, sliding_log or sliding_window)", rl.Algorithm)
		}
	}
	if rl.Burst != 0 && l.Kind != algorithms.TokenBucket && l.Kind != algorithms.LeakyBucket {
		return nil, fmt.Errorf("burst applies only to token_bucket and leaky_bucket, not %s", l.Kind)
	}
	if err := l.setParams(int64(rl.RequestsPerUnit), unitWindow(l.Unit), rl.Burst); err != nil {
		return nil, err
	}
	return l, nil
}

// metadataStruct converts a descriptor's YAML metadata (yaml.v2's maps
// have keys of any type) to a Struct: keys must be strings, values
// strings, numbers, booleans, null, lists or maps of them.
func metadataStruct(m map[string]any) (*structpb.Struct, error) {
	v, err := jsonish(m)
	if err != nil {
		return nil, err
	}
	return structpb.NewStruct(v.(map[string]any))
}

func jsonish(v any) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			c, err := jsonish(e)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			out[k] = c
		}
		return out, nil
	case map[any]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("key %v is not a string", k)
			}
			c, err := jsonish(e)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", ks, err)
			}
			out[ks] = c
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, err := jsonish(e)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out[i] = c
		}
		return out, nil
	case nil, string, bool, int, int64, uint64, float64:
		return v, nil
	}
	return nil, fmt.Errorf("value %v of type %T is not a string, number, boolean, list or map", v, v)
}

// setParams validates the limiter parameters against algorithms.New and the
// Redis scripts' bounds (config.RedisParams). Limit 0 is kept as "deny all".
func (l *Limit) setParams(limit int64, window time.Duration, burst int64) error {
	if limit == 0 {
		l.Params = algorithms.Params{Window: window}
		return nil
	}
	lim, err := algorithms.New(l.Kind, algorithms.Params{Limit: limit, Window: window, Burst: burst})
	if err != nil {
		return err
	}
	l.Params = lim.Params()
	return config.RedisParams(l.Kind, l.Params)
}

// match is the outcome of looking a descriptor up.
type match struct {
	limit *Limit
	// shared[i], when not empty, replaces entry i's value in the Redis key:
	// the share_threshold wildcard value every match of entry i shares.
	shared []string
	// override reports a limit from the descriptor's own limit field.
	override bool
	// stat is the limit's statistics key, envoyproxy/ratelimit's: the
	// configured full key, the request's entries (detailed_metric, an
	// override) or the value_to_metric key; fromRequest reports that it
	// holds values of the request, which Metrics bounds.
	stat        string
	fromRequest bool
}

// errOverride is a descriptor limit override the service cannot apply
// (gRPC INVALID_ARGUMENT).
type errOverride struct{ msg string }

func (e *errOverride) Error() string { return e.msg }

// lookup finds the limit of descriptor d in domain, with
// envoyproxy/ratelimit's rules (config_impl.go GetLimit): an unknown
// domain has no limits; a limit override applies to any descriptor of a
// known domain (override); otherwise the entries are walked level by level, each
// matching "key_value" first, then the level's wildcard values in file
// order, then "key" alone, and the limit is the one of the node the last
// entry reaches (none if the walk stops earlier or the node has none).
func (c *Config) lookup(domain string, d *ratelimitv3.RateLimitDescriptor) (*match, error) {
	if c == nil {
		return nil, nil
	}
	root := c.domains[domain]
	if root == nil {
		return nil, nil
	}
	es := d.GetEntries()
	n := root
	var lim *Limit
	var shared []string
	// vk is the value_to_metric key (config_impl.go's
	// valueToMetricFullKey): per entry the key, and the value the level
	// was matched with — the request's for a key_value match or a level
	// with value_to_metric, the wildcard's (share_threshold's) otherwise,
	// none for a key-only match.
	var vk strings.Builder
	vk.WriteString(domain)
	for i, e := range es {
		final := e.GetKey() + "_" + e.GetValue()
		next := n.children[final]
		val := e.GetValue()
		if next == nil {
			for _, w := range n.wildcards {
				if globMatch(w.parts, final) {
					next = n.children[w.key]
					if next.share != "" || !next.valueTo {
						val = strings.TrimPrefix(w.key, e.GetKey()+"_")
					}
					break
				}
			}
		}
		if next == nil {
			next = n.children[e.GetKey()]
			if next != nil && !next.valueTo {
				val = ""
			}
		}
		vk.WriteByte('.')
		vk.WriteString(e.GetKey())
		if next == nil {
			break
		}
		if val != "" {
			vk.WriteByte('_')
			vk.WriteString(val)
		}
		if next.share != "" {
			if shared == nil {
				shared = make([]string, len(es))
			}
			shared[i] = next.share
		}
		if next.limit != nil && i == len(es)-1 {
			lim = next.limit
		}
		if len(next.children) == 0 {
			break
		}
		n = next
	}
	if o := d.GetLimit(); o != nil {
		m, err := override(domain, d, o, lim)
		if m != nil {
			m.stat, m.fromRequest = m.limit.key, true
		}
		return m, err
	}
	if lim == nil {
		return nil, nil
	}
	m := &match{limit: lim, shared: shared, stat: lim.key}
	switch {
	case lim.Detailed:
		cp := *lim
		cp.key = detailedKey(domain, es, shared)
		m.limit, m.stat, m.fromRequest = &cp, cp.key, true
	case vk.String() != lim.key:
		m.stat, m.fromRequest = vk.String(), true
	}
	return m, nil
}

// override is the limit of a descriptor's limit override: its requests per
// unit and unit (times unit_multiplier), with the algorithm of the limit
// the entries match in the configuration (conf, may be nil), fixed_window
// if none, never in shadow mode, burst = limit. The counter is not shared
// (share_threshold does not apply), as in envoyproxy/ratelimit.
func override(domain string, d *ratelimitv3.RateLimitDescriptor, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride, conf *Limit) (*match, error) {
	u := pb.RateLimitResponse_RateLimit_Unit(o.GetUnit())
	w := unitWindow(u)
	if w == 0 {
		return nil, &errOverride{"limit override: unit " + o.GetUnit().String() + " is not SECOND, MINUTE, HOUR, DAY, MONTH or YEAR"}
	}
	if m := o.GetUnitMultiplier(); m != nil && m.GetValue() > 1 {
		if w > algorithms.MaxWindow/time.Duration(m.GetValue()) {
			return nil, &errOverride{"limit override: unit × unit_multiplier is longer than " + algorithms.MaxWindow.String()}
		}
		w *= time.Duration(m.GetValue())
	}
	l := &Limit{Unit: u, RequestsPerUnit: o.GetRequestsPerUnit(), Kind: algorithms.FixedWindow, key: descriptorKey(domain, d)}
	if conf != nil && !conf.Unlimited {
		l.Kind = conf.Kind
	}
	if err := l.setParams(int64(o.GetRequestsPerUnit()), w, 0); err != nil {
		return nil, &errOverride{"limit override: " + err.Error()}
	}
	return &match{limit: l, override: true}, nil
}

// descriptorKey is the full key of a descriptor's own entries
// ("domain.k_v.k"), the metric name of an override.
func descriptorKey(domain string, d *ratelimitv3.RateLimitDescriptor) string {
	return detailedKey(domain, d.GetEntries(), nil)
}

func detailedKey(domain string, es []*ratelimitv3.RateLimitDescriptor_Entry, shared []string) string {
	var b strings.Builder
	b.WriteString(domain)
	for i, e := range es {
		b.WriteByte('.')
		b.WriteString(e.GetKey())
		v := e.GetValue()
		if i < len(shared) && shared[i] != "" {
			v = shared[i]
		}
		if v != "" {
			b.WriteByte('_')
			b.WriteString(v)
		}
	}
	return b.String()
}

// globMatch reports whether s matches the pattern split on '*' (each '*'
// matches any run of bytes, possibly empty).
func globMatch(parts []string, s string) bool {
	if len(parts) == 1 {
		return parts[0] == s
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	s = s[len(first) : len(s)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return true
}

// redisKeyPart is the key part of a configured descriptor's Redis key: the
// entries as "k=v" joined by '&', with '%', '=', '&' and '*' escaped in
// keys and values (%XX), a shared wildcard value written as "=*" + value
// — so distinct descriptors never share a key (envoyproxy/ratelimit joins
// with '_', where key "a_b" value "c" and key "a" value "b_c" collide).
func redisKeyPart(es []*ratelimitv3.RateLimitDescriptor_Entry, shared []string) string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('&')
		}
		escapeTo(&b, e.GetKey())
		b.WriteByte('=')
		if i < len(shared) && shared[i] != "" {
			b.WriteByte('*')
			escapeTo(&b, shared[i])
			continue
		}
		escapeTo(&b, e.GetValue())
	}
	return b.String()
}

func escapeTo(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', '=', '&', '*':
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		default:
			b.WriteByte(c)
		}
	}
}

// unitOf is the response unit of a window: the unit it equals exactly, or
// UNKNOWN.
func unitOf(w time.Duration) pb.RateLimitResponse_RateLimit_Unit {
	switch w {
	case time.Second:
		return pb.RateLimitResponse_RateLimit_SECOND
	case time.Minute:
		return pb.RateLimitResponse_RateLimit_MINUTE
	case time.Hour:
		return pb.RateLimitResponse_RateLimit_HOUR
	case 24 * time.Hour:
		return pb.RateLimitResponse_RateLimit_DAY
	}
	return pb.RateLimitResponse_RateLimit_UNKNOWN
}
