package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v2"

	"github.com/sluice-proxy/sluice/config"
)

// A manifest is a file that carries sluice's plugin configuration inside
// something else: an Istio or Higress WasmPlugin (spec.pluginConfig;
// Higress's defaultConfig and matchRules), an Istio EnvoyFilter, or an
// Envoy bootstrap or xDS resource file (LDS, ECDS) with Wasm HTTP filters.
// `sluice check` finds every sluice configuration in it by content and
// checks each as the module would receive it.

// embedded is one sluice configuration found in a manifest.
type embedded struct {
	// where says where it was found, e.g. "listener ingress, filter sluice".
	where string
	// data is the plugin configuration as the module receives it (JSON).
	data []byte
	// redis is set when the manifest loads sluice-redis.wasm.
	redis bool
	// dynmod is set when the manifest loads libsluice.so (Envoy's dynamic-module filter).
	dynmod bool
	// path maps a JSON path of data to a path of the manifest ("" stays "").
	path func(string) string
	// skipped, when set, says why this Wasm plugin is not checked.
	skipped string
	// err is a problem of the manifest itself (the configuration could not
	// be extracted): one line per problem.
	err string
}

// Wasm filter type names, and the typed structs that can wrap them.
const (
	wasmFilterType  = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
	dynmodType      = "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"
	stringValueType = "type.googleapis.com/google.protobuf.StringValue"
	listenerType    = "type.googleapis.com/envoy.config.listener.v3.Listener"
	extConfigType   = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
)

var typedStructTypes = map[string]bool{
	"type.googleapis.com/udpa.type.v1.TypedStruct": true,
	"type.googleapis.com/xds.type.v3.TypedStruct":  true,
}

// findEmbedded reports whether data is a manifest (a YAML or JSON document
// stream in which some document is a Kubernetes object or an Envoy
// bootstrap or xDS file) and, if so, every sluice configuration in it. kinds
// lists the documents seen (for a file without any).
//
// A file is JSON, and read as the module reads it, when after an optional
// byte-order mark (config.TrimByteOrderMark, as the module) and JSON
// whitespace it starts with '{' or '[', or when it is one JSON value as a
// whole (true, 0, "x": the module says it is not an object). Such a file is
// a manifest only when it is a JSON object whose top level says so; any
// other file is YAML.
func findEmbedded(data []byte) (found []embedded, kinds []string, manifest bool) {
	body := config.TrimByteOrderMark(data)
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) > 0 && (trimmed[0] == '{' || trimmed[0] == '[') || json.Valid(body) {
		// A JSON document: only a manifest if its top level says so;
		// otherwise it is a plugin configuration, checked as it is.
		var top map[string]json.RawMessage
		if json.Unmarshal(body, &top) != nil || !looksLikeManifest(top) {
			return nil, nil, false
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []yaml.MapSlice
	for {
		var doc yaml.MapSlice
		err := dec.Decode(&doc)
		if err == io.EOF {
			break
		}
		if err != nil {
			// Not JSON, and not YAML that could be a manifest: say where
			// the YAML breaks, one line per error.
			return []embedded{{err: yamlError(err)}}, nil, true
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
	if len(docs) == 0 {
		return nil, nil, false // nothing but comments or "---": the module says what it is
	}
	// YAML, or a JSON manifest: a manifest, or else not a configuration at all.
	for i, doc := range docs {
		prefix := ""
		if len(docs) > 1 {
			prefix = "document " + strconv.Itoa(i+1) + ", "
		}
		kind, _ := get(doc, "kind").(string)
		api, _ := get(doc, "apiVersion").(string)
		name := objectName(doc)
		switch {
		case kind == "WasmPlugin" && strings.HasPrefix(api, "extensions.higress.io/"):
			found = append(found, higressPlugin(prefix+"WasmPlugin "+name, doc))
			kinds = append(kinds, "WasmPlugin")
		case kind == "WasmPlugin":
			found = append(found, istioPlugin(prefix+"WasmPlugin "+name, doc))
			kinds = append(kinds, "WasmPlugin")
		case kind == "EnvoyFilter":
			found = append(found, envoyFilters(prefix+"EnvoyFilter "+name+", ", get(doc, "spec"), "spec")...)
			kinds = append(kinds, "EnvoyFilter")
		case kind != "":
			kinds = append(kinds, kind)
		case looksLikeManifest(topKeys(doc)):
			found = append(found, envoyFilters(prefix, doc, "")...)
			kinds = append(kinds, "an Envoy configuration")
		default:
			var keys []string
			for k := range topKeys(doc) {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			kinds = append(kinds, "YAML with keys "+strings.Join(keys, ", "))
		}
	}
	return found, kinds, true
}

// yamlError renders an error of the YAML decoder one line per error, each
// "yaml: line N: …" and printable: a document that is not a mapping (a
// scalar or a list: no manifest is one) is an unmarshal error naming it.
func yamlError(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		var lines []string
		for _, l := range strings.Split(err.Error(), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, printable(l))
			}
		}
		return strings.Join(lines, "\n")
	}
	lines := make([]string, len(te.Errors))
	for i, e := range te.Errors {
		e = strings.Replace(e, " into yaml.MapSlice", " into a mapping (a manifest is one)", 1)
		lines[i] = printable("yaml: " + e)
	}
	return strings.Join(lines, "\n")
}

// looksLikeManifest: the top-level keys of a Kubernetes object or an
// Envoy bootstrap or xDS resource file — none of them is a field of
// sluice's configuration.
func looksLikeManifest(top map[string]json.RawMessage) bool {
	for _, k := range []string{"apiVersion", "kind", "static_resources", "dynamic_resources", "resources", "staticResources"} {
		if _, ok := top[k]; ok {
			return true
		}
	}
	return false
}

// topKeys returns the set of a mapping's string keys.
func topKeys(doc yaml.MapSlice) map[string]json.RawMessage {
	top := map[string]json.RawMessage{}
	for _, it := range doc {
		if k, ok := it.Key.(string); ok {
			top[printable(k)] = nil
		}
	}
	return top
}

// get returns the value of key in a YAML mapping, or nil.
func get(v any, key string) any {
	m, _ := v.(yaml.MapSlice)
	for _, it := range m {
		if k, ok := it.Key.(string); ok && k == key {
			return it.Value
		}
	}
	return nil
}

func has(v any, key string) bool {
	m, _ := v.(yaml.MapSlice)
	for _, it := range m {
		if k, ok := it.Key.(string); ok && k == key {
			return true
		}
	}
	return false
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// objectName is "namespace/name" of a Kubernetes object, or "name".
func objectName(doc yaml.MapSlice) string {
	md := get(doc, "metadata")
	name, ns := printable(str(get(md, "name"))), printable(str(get(md, "namespace")))
	if name == "" {
		name = "(unnamed)"
	}
	if ns != "" {
		return ns + "/" + name
	}
	return name
}

// redisModule reports whether a module reference (an OCI or HTTPS URL, a
// file name) names sluice-redis.wasm; looksLikeSluice whether it names
// sluice at all.
func redisModule(ref string) bool { return strings.Contains(strings.ToLower(ref), "sluice-redis") }

func looksLikeSluice(ref string) bool { return strings.Contains(strings.ToLower(ref), "sluice") }

// istioPlugin extracts spec.pluginConfig of an Istio WasmPlugin: Istio hands
// it to the plugin as JSON (a StringValue), an absent one as nothing.
func istioPlugin(where string, doc yaml.MapSlice) embedded {
	spec := get(doc, "spec")
	url := str(get(spec, "url"))
	e := embedded{where: where, redis: redisModule(url), path: prefixPath("pluginConfig")}
	if !looksLikeSluice(url) && !looksLikeSluice(str(get(spec, "pluginName"))) {
		e.skipped = "not sluice (url " + printable(url) + ")"
		return e
	}
	if pc := get(spec, "pluginConfig"); pc != nil {
		js, err := toJSON(pc, "pluginConfig")
		if err != nil {
			e.err = err.Error()
			return e
		}
		e.data = js
	}
	return e
}

// higressPlugin builds the plugin configuration of a Higress WasmPlugin as
// Higress's controller does (pkg/ingress/config/ingress_config.go): its
// defaultConfig (unless defaultConfigDisable), and every matchRule not
// configDisable'd as an entry of "_rules_": the rule's config with
// _match_route_ (ingress), _match_domain_ (domain) and _match_service_
// (service). Paths are reported in the manifest's own terms.
func higressPlugin(where string, doc yaml.MapSlice) embedded {
	spec := get(doc, "spec")
	url := str(get(spec, "url"))
	e := embedded{where: where, redis: redisModule(url)}
	if !looksLikeSluice(url) && !looksLikeSluice(str(get(spec, "pluginName"))) {
		e.skipped = "not sluice (url " + printable(url) + ")"
		return e
	}
	var out yaml.MapSlice
	dc, disabled := get(spec, "defaultConfig"), get(spec, "defaultConfigDisable") == true
	if m, ok := dc.(yaml.MapSlice); ok && !disabled {
		out = append(out, m...)
	} else if dc != nil && !disabled {
		e.err = "defaultConfig: must be a mapping"
		return e
	}
	var entries []any
	var ruleOf []int // _rules_ index → matchRules index
	rules, _ := get(spec, "matchRules").([]any)
	for j, r := range rules {
		if get(r, "configDisable") == true {
			continue
		}
		var entry yaml.MapSlice
		if c, ok := get(r, "config").(yaml.MapSlice); ok {
			entry = append(entry, c...)
		}
		for _, m := range [][2]string{{"ingress", "_match_route_"}, {"domain", "_match_domain_"}, {"service", "_match_service_"}} {
			if v := get(r, m[0]); v != nil {
				entry = append(entry, yaml.MapItem{Key: m[1], Value: v})
			}
		}
		entries = append(entries, entry)
		ruleOf = append(ruleOf, j)
	}
	if len(entries) > 0 {
		out = append(out, yaml.MapItem{Key: "_rules_", Value: entries})
	}
	if out == nil && (disabled || dc == nil) {
		e.err = "no plugin configuration: no defaultConfig and no matchRules"
		if disabled {
			e.err = "no plugin configuration: defaultConfigDisable and no matchRules (Higress would not load the plugin)"
		}
		return e
	}
	js, err := toJSON(out, "defaultConfig")
	if err != nil {
		e.err = err.Error()
		return e
	}
	e.data = js
	e.path = func(p string) string { return higressPath(p, ruleOf) }
	return e
}

// higressPath maps a path of the configuration Higress builds to the
// manifest: _rules_[i] is matchRules[j] (its config, or the ingress,
// domain and service lists), the rest is defaultConfig.
func higressPath(p string, ruleOf []int) string {
	const rk = "_rules_"
	if p == rk {
		return "matchRules"
	}
	if !strings.HasPrefix(p, rk+"[") {
		return prefixPath("defaultConfig")(p)
	}
	end := strings.IndexByte(p, ']')
	i, err := strconv.Atoi(p[len(rk)+1 : max(end, len(rk)+1)])
	if end < 0 || err != nil || i < 0 || i >= len(ruleOf) {
		return p
	}
	mr, rest := "matchRules["+strconv.Itoa(ruleOf[i])+"]", p[end+1:]
	for _, m := range [][2]string{{"._match_route_", ".ingress"}, {"._match_domain_", ".domain"}, {"._match_service_", ".service"}} {
		if strings.HasPrefix(rest, m[0]) {
			return mr + m[1] + rest[len(m[0]):]
		}
	}
	if rest == "" {
		return mr
	}
	return mr + ".config" + rest
}

// prefixPath returns a mapper that puts root before every path.
func prefixPath(root string) func(string) string {
	return func(p string) string {
		switch {
		case p == "":
			return root
		case strings.HasPrefix(p, "["):
			return root + p
		}
		return root + "." + p
	}
}

// envoyFilters finds every Wasm HTTP filter under v (a bootstrap, an xDS
// resource file, an EnvoyFilter's spec) and extracts each configuration.
// where names the document; the location of each filter is built from the
// listeners, filter chains and filters around it.
func envoyFilters(where string, v any, yamlPath string) []embedded {
	var out []embedded
	var walk func(v any, p string, loc []string, parentKey string)
	walk = func(v any, p string, loc []string, parentKey string) {
		switch n := v.(type) {
		case yaml.MapSlice:
			typ := str(get(n, "@type"))
			name := printable(str(get(n, "name")))
			switch {
			case parentKey == "listeners" || typ == listenerType:
				loc = append(loc, "listener "+name)
			case parentKey == "http_filters" || typ == extConfigType || (parentKey == "value" && has(n, "typed_config")): // an EnvoyFilter's patch.value
				loc = append(loc, "filter "+name)
			}
			if typ == wasmFilterType {
				out = append(out, wasmFilter(where, loc, p, n))
				return
			}
			if typ == dynmodType {
				out = append(out, dynmodFilter(where, loc, p, n))
				return
			}
			if typedStructTypes[typ] && str(get(n, "type_url")) == wasmFilterType {
				out = append(out, wasmFilter(where, loc, p+".value", get(n, "value")))
				return
			}
			for _, it := range n {
				k := fmt.Sprint(it.Key)
				walk(it.Value, joinPath(p, k), loc, k)
			}
		case []any:
			for i, e := range n {
				l := loc
				if parentKey == "filter_chains" && len(n) > 1 {
					chain := "filter chain " + strconv.Itoa(i)
					if nm := str(get(e, "name")); nm != "" {
						chain = "filter chain " + printable(nm)
					}
					l = append(append([]string(nil), loc...), chain)
				}
				if parentKey == "configPatches" {
					l = append(append([]string(nil), loc...), "configPatches["+strconv.Itoa(i)+"]")
				}
				walk(e, p+"["+strconv.Itoa(i)+"]", l, parentKey)
			}
		}
	}
	walk(v, yamlPath, nil, "")
	return out
}

func joinPath(p, k string) string {
	if p == "" {
		return k
	}
	return p + "." + k
}

// wasmFilter extracts the plugin configuration of one Wasm HTTP filter
// (envoy.extensions.filters.http.wasm.v3.Wasm): config.configuration, a
// StringValue whose value is the JSON the plugin receives. It is checked
// when the filter's module, vm_id or root_id names sluice.
func wasmFilter(where string, loc []string, p string, w any) embedded {
	l := strings.Join(loc, ", ")
	if l == "" {
		l = p
	}
	// The value is the JSON text: a syntax error's line and column are the
	// value's.
	e := embedded{where: where + l, path: func(s string) string {
		if s == "" {
			return "configuration.value"
		}
		return s
	}}
	pc := get(w, "config")
	vm := get(pc, "vm_config")
	code := get(vm, "code")
	module := str(get(get(code, "local"), "filename"))
	if module == "" {
		module = str(get(get(get(code, "remote"), "http_uri"), "uri"))
	}
	e.redis = redisModule(module)
	if !looksLikeSluice(module) && !looksLikeSluice(str(get(vm, "vm_id"))) && !looksLikeSluice(str(get(pc, "root_id"))) {
		what := "module " + printable(module)
		if module == "" {
			what = "no module file or URL"
		}
		e.skipped = "not sluice (" + what + ")"
		return e
	}
	e.stringValue(pc, "configuration")
	return e
}

// stringValue reads the configuration out of field of v, a StringValue whose value is the
// JSON text the module receives (none: an empty configuration).
func (e *embedded) stringValue(v any, field string) {
	if !has(v, field) {
		return // the module receives an empty configuration
	}
	c := get(v, field)
	if t := str(get(c, "@type")); t != stringValueType {
		e.err = field + ": the @type is " + strconv.Quote(t) + ", not " + stringValueType + ": sluice reads its configuration as JSON text"
		return
	}
	val, ok := get(c, "value").(string)
	if !ok && get(c, "value") != nil {
		e.err = field + ".value: must be a string (the JSON text of the configuration)"
		return
	}
	e.data = []byte(val)
}

// dynmodFilter extracts the plugin configuration of one dynamic-module HTTP filter
// (envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter): filter_config, a
// StringValue whose value is the JSON libsluice.so receives. It is checked, for libsluice.so,
// when dynamic_module_config.name names sluice.
func dynmodFilter(where string, loc []string, p string, f any) embedded {
	l := strings.Join(loc, ", ")
	if l == "" {
		l = p
	}
	e := embedded{where: where + l, dynmod: true, path: func(s string) string {
		if s == "" {
			return "filter_config.value"
		}
		return s
	}}
	module := str(get(get(f, "dynamic_module_config"), "name"))
	if !looksLikeSluice(module) {
		e.skipped = "not sluice (dynamic module " + printable(module) + ")"
		return e
	}
	e.stringValue(f, "filter_config")
	return e
}

// toJSON renders a YAML value as JSON, mapping keys in their order, as the
// control plane hands it to the plugin. A value JSON cannot carry (NaN,
// infinity, a non-string key) is an error naming its path.
func toJSON(v any, root string) ([]byte, error) {
	var b bytes.Buffer
	err := writeJSON(&b, v, root)
	return b.Bytes(), err
}

func writeJSON(b *bytes.Buffer, v any, p string) error {
	switch n := v.(type) {
	case yaml.MapSlice:
		b.WriteByte('{')
		for i, it := range n {
			k, ok := it.Key.(string)
			if !ok {
				// YAML reads an unquoted 1 or true as a number or a
				// boolean; Kubernetes would refuse such a key.
				return fmt.Errorf("%s: key %s is not a string", p, printable(fmt.Sprint(it.Key)))
			}
			if i > 0 {
				b.WriteByte(',')
			}
			kb, _ := json.Marshal(k)
			b.Write(kb)
			b.WriteByte(':')
			if err := writeJSON(b, it.Value, joinPath(p, k)); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case map[any]any: // not produced when decoding into MapSlice; sorted for a stable output
		keys := make([]string, 0, len(n))
		conv := map[string]any{}
		for k, val := range n {
			ks := fmt.Sprint(k)
			keys = append(keys, ks)
			conv[ks] = val
		}
		sort.Strings(keys)
		var ms yaml.MapSlice
		for _, k := range keys {
			ms = append(ms, yaml.MapItem{Key: k, Value: conv[k]})
		}
		return writeJSON(b, ms, p)
	case []any:
		b.WriteByte('[')
		for i, e := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeJSON(b, e, p+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(n))
	case int:
		b.WriteString(strconv.Itoa(n))
	case int64:
		b.WriteString(strconv.FormatInt(n, 10))
	case uint64:
		b.WriteString(strconv.FormatUint(n, 10))
	case float64:
		if math.IsNaN(n) || math.IsInf(n, 0) {
			return fmt.Errorf("%s: %v is not a JSON number", p, n)
		}
		b.WriteString(strconv.FormatFloat(n, 'g', -1, 64))
	case string:
		sb, _ := json.Marshal(n)
		b.Write(sb)
	case time.Time:
		sb, _ := json.Marshal(n.Format(time.RFC3339Nano))
		b.Write(sb)
	default:
		return errors.New(p + ": a value of type " + fmt.Sprintf("%T", v) + " has no JSON form")
	}
	return nil
}

// describeKinds lists the kinds of documents seen, for the message about a
// manifest without a sluice configuration.
func describeKinds(kinds []string) string {
	seen := map[string]bool{}
	var out []string
	for _, k := range kinds {
		if !seen[k] {
			seen[k] = true
			out = append(out, printable(k))
		}
	}
	return strings.Join(out, ", ")
}
