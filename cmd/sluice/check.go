package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sluice-proxy/sluice/config"
)

func init() {
	commands["check"] = command{summary: "validate a plugin configuration", run: runCheck}
}

// stdin is read by `sluice check -`; tests replace it.
var stdin io.Reader = os.Stdin

const checkUsage = `usage: sluice check [--redis | --target wasm|redis|dynmod] [--explain KIND=VALUE]... FILE...

Validates sluice plugin configurations (JSON; "-" reads standard input) for
the module that will load them: sluice.wasm by default, sluice-redis.wasm with
--redis or --target redis (the build with the Redis backend, whose rules have
the Redis scripts' bounds), libsluice.so with --target dynmod (the Envoy
dynamic module: the local backend only). It runs the module's own validation,
so "ok" means the module loads the configuration. Prints "ok" and one line per
rule, or every error found, one per line, each naming its JSON path; input is
quoted and escaped in both. With several files, each is checked and reported:
"FILE: ok" and its rules indented, or its errors, each line starting with FILE.

A FILE may also be a manifest that carries the configuration (YAML or JSON,
recognized by its content): an Istio WasmPlugin (spec.pluginConfig), a
Higress WasmPlugin (defaultConfig and matchRules, combined as Higress's
controller does), an Istio EnvoyFilter, or an Envoy bootstrap, LDS or ECDS
file (the StringValue configuration of every Wasm HTTP filter whose module,
vm_id or root_id names sluice, and of every dynamic-module HTTP filter whose
module is named sluice, checked for libsluice.so). Each configuration found
is reported as "FILE: WHERE: ok" (e.g. "envoy.yaml: listener ingress, filter
sluice: ok"),
or its errors as "FILE: WHERE: PATH: MESSAGE", PATH in the manifest's terms
(pluginConfig.rules[0].limit, matchRules[1].config.rules[0].window). Without
--redis, a configuration is checked for sluice-redis.wasm when the manifest
loads a module named sluice-redis, else for sluice.wasm. Other Wasm plugins
are listed as skipped; a manifest without a sluice configuration is an
error. A file that starts with '{' or '[' (after an optional byte-order
mark and whitespace), or that is one JSON value, is a JSON configuration
unless its top level is a manifest's (apiVersion, kind, static_resources…);
any other file is YAML.

--explain describes a sample request piece by piece (repeatable: method=POST,
path=/api/x?k=1, header:NAME=VALUE, metadata:NAMESPACE:PATH=VALUE,
attribute:NAME=VALUE, route=NAME) and prints, after the rules of a JSON
configuration, what each top-level rule does with it: whether it applies, its
key, and the parameters that apply (an override, a plan, or the rule's own).

Exit status: 0 every file valid, 1 any invalid or unreadable, 2 usage error.
`

// runCheck implements `sluice check [--redis] FILE...`.
func runCheck(args []string, stdout, stderr io.Writer) int {
	build := config.BuildLocal
	var names []string
	stdinSeen, wantTarget, wantExplain := false, false, false
	var sample *explainSample // --explain (explain.go)
	for _, a := range args {
		if wantExplain {
			wantExplain = false
			if err := sample.add(a); err != nil {
				return usageError(stderr, "check", err)
			}
			continue
		}
		if wantTarget {
			wantTarget = false
			switch a {
			case "wasm":
				build = config.BuildLocal
			case "redis":
				build = config.BuildRedis
			case "dynmod":
				build = config.BuildDynamic
			default:
				return usageError(stderr, "check", fmt.Errorf("--target %s: want wasm, redis or dynmod", printable(a)))
			}
			continue
		}
		switch {
		case a == "-target" || a == "--target":
			wantTarget = true
		case a == "-explain" || a == "--explain":
			wantExplain = true
			if sample == nil {
				sample = newExplainSample()
			}
		case a == "-h" || a == "-help" || a == "--help":
			fmt.Fprint(stdout, checkUsage)
			return 0
		case a == "-redis" || a == "--redis":
			build = config.BuildRedis
		case a == "":
			return usageError(stderr, "check", errors.New("empty FILE"))
		case a == "-" && stdinSeen:
			return usageError(stderr, "check", errors.New(`"-" (standard input) given twice`))
		case len(a) > 1 && a[0] == '-':
			return usageError(stderr, "check", fmt.Errorf("unknown flag %s", printable(a)))
		default:
			stdinSeen = stdinSeen || a == "-"
			names = append(names, a)
		}
	}
	if wantTarget {
		return usageError(stderr, "check", errors.New("--target needs wasm, redis or dynmod"))
	}
	if wantExplain {
		return usageError(stderr, "check", errors.New("--explain needs KIND=VALUE"))
	}
	if len(names) == 0 {
		return usageError(stderr, "check", errors.New("no FILE"))
	}
	code, needsRedis := 0, false
	for _, name := range names {
		ok, redis := checkFile(name, build, len(names) > 1, sample, stdout, stderr)
		if !ok {
			code = 1
		}
		needsRedis = needsRedis || redis
	}
	if needsRedis {
		fmt.Fprintf(stderr, "sluice check: checked for %s; `sluice check --redis` checks for sluice-redis.wasm\n", build)
	}
	return code
}

// checkFile checks one configuration and reports it: on stdout when it is
// valid ("ok" and its rules; with several files "NAME: ok" and the rules
// indented), on stderr when it is not. needsRedis reports a Redis rule
// refused by the build without the Redis backend.
func checkFile(name string, build config.Build, several bool, sample *explainSample, stdout, stderr io.Writer) (ok, needsRedis bool) {
	var data []byte
	var err error
	if name == "-" {
		data, err = io.ReadAll(io.LimitReader(stdin, config.MaxConfigSize+1))
		name = "<stdin>"
	} else {
		data, err = os.ReadFile(name)
		name = printable(name)
	}
	if err != nil {
		msg := printable(err.Error())
		if several && name == "<stdin>" {
			msg = name + ": " + msg
		}
		fmt.Fprintf(stderr, "sluice check: cannot read configuration: %s\n", msg)
		return false, false
	}
	if found, kinds, ok := findEmbedded(data); ok {
		return checkManifest(name, found, kinds, build, stdout, stderr)
	}
	c, err := config.ParseFor(data, build)
	if err != nil {
		lines, needsRedis := configErrorLines(name, data, err)
		for _, l := range lines {
			fmt.Fprintln(stderr, l)
		}
		return false, needsRedis
	}
	indent := ""
	if several {
		fmt.Fprintln(stdout, name+": ok")
		indent = "  "
	} else {
		fmt.Fprintln(stdout, "ok")
	}
	printRules(stdout, indent, c, nil)
	if sample != nil {
		explain(stdout, indent, c, sample)
	}
	return true, false
}

// printRules prints one line per rule of c, then each "_rules_" entry with
// its own rules indented; scope rewrites an entry's summary (nil: as is).
func printRules(w io.Writer, indent string, c *config.Config, scope func(*config.Scope) string) {
	for _, r := range c.Rules {
		fmt.Fprintln(w, indent+r.Summary())
	}
	for _, sc := range c.Scopes {
		s := sc.Summary()
		if scope != nil {
			s = scope(sc)
		}
		fmt.Fprintln(w, indent+s)
		for _, r := range sc.Config.Rules {
			fmt.Fprintln(w, indent+"  "+r.Summary())
		}
	}
}

// checkManifest checks every sluice configuration found in a manifest
// (a WasmPlugin, an EnvoyFilter, an Envoy bootstrap or xDS file), each
// reported as "NAME: WHERE: ok" and its rules, or its errors as "NAME:
// WHERE: PATH: MESSAGE" with PATH in the manifest's terms. Without --redis a
// configuration is checked for the module the manifest loads: sluice-redis.wasm
// when its URL or file name says so, else sluice.wasm.
func checkManifest(name string, found []embedded, kinds []string, build config.Build, stdout, stderr io.Writer) (ok, needsRedis bool) {
	ok = true
	checked := 0
	for _, e := range found {
		prefix := name + ": "
		if e.where != "" {
			prefix += e.where + ": "
		}
		if e.skipped != "" {
			fmt.Fprintln(stdout, prefix+"skipped: "+e.skipped)
			continue
		}
		checked++
		if e.err != "" {
			for _, l := range strings.Split(e.err, "\n") {
				fmt.Fprintln(stderr, prefix+l)
			}
			ok = false
			continue
		}
		b := build
		switch {
		case e.dynmod:
			b = config.BuildDynamic
		case e.redis:
			b = config.BuildRedis
		}
		c, err := config.ParseFor(e.data, b)
		if err != nil {
			lines, redis := configErrorLinesAt(prefix, e.data, err, e.path)
			for _, l := range lines {
				fmt.Fprintln(stderr, l)
			}
			ok, needsRedis = false, needsRedis || redis
			continue
		}
		fmt.Fprintln(stdout, prefix+"ok")
		printRules(stdout, "  ", c, func(sc *config.Scope) string {
			s := sc.Summary()
			old := "(" + config.RulesKey + "[" + strconv.Itoa(sc.Index) + "])"
			if p := e.path(config.RulesKey + "[" + strconv.Itoa(sc.Index) + "]"); p != "" && e.path != nil {
				s = strings.Replace(s, old, "("+p+")", 1)
			}
			return s
		})
	}
	if checked == 0 {
		what := "no sluice configuration found in"
		if len(found) > 0 {
			what = "no Wasm plugin that loads sluice in"
		}
		fmt.Fprintf(stderr, "%s: %s %s; sluice check reads a JSON configuration, an Istio or Higress WasmPlugin, an Istio EnvoyFilter, or an Envoy bootstrap or xDS file with a sluice Wasm filter\n",
			name, what, describeKinds(kinds))
		return false, false
	}
	return ok, needsRedis
}

// configErrorLines renders a configuration error of file name as `sluice check` prints it:
// one line per error, "NAME: PATH: MESSAGE", input quoted and escaped. needsRedis reports a
// Redis rule refused by the build without the Redis backend.
func configErrorLines(name string, data []byte, err error) (lines []string, needsRedis bool) {
	return configErrorLinesAt(name+": ", data, err, nil)
}

// configErrorLinesAt is configErrorLines with each line starting with
// prefix and each path mapped by path (nil: as is; an empty path is
// "configuration" unless path maps it to something else).
func configErrorLinesAt(prefix string, data []byte, err error, path func(string) string) (lines []string, needsRedis bool) {
	var errs config.Errors
	if !errors.As(err, &errs) {
		return []string{prefix + printable(err.Error())}, false
	}
	for _, e := range errs {
		msg := e.Error()
		if path != nil {
			if p := path(e.Path); p != "" {
				msg = (&config.Error{Path: p, Msg: e.Msg}).Error()
			}
		}
		if e.Path == "" && e.Msg == "is not valid JSON" {
			msg += syntaxHint(data)
		}
		needsRedis = needsRedis || strings.HasPrefix(e.Msg, `"redis" needs sluice-redis.wasm`)
		lines = append(lines, prefix+msg)
	}
	return lines, needsRedis
}

// printable returns s, or s quoted and escaped (strconv.Quote) when it holds
// anything strconv.IsPrint rejects — a file name, or an operating-system
// error that carries one, is echoed like configuration input.
func printable(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// syntaxHint locates a JSON syntax error for a person: " (line L, column C:
// reason)", or "" when encoding/json finds nothing to say. The parser in the
// guest (gjson) only reports that the document is invalid; the CLI can afford
// the standard library's decoder to say where. A byte-order mark before
// the text is not counted (the module ignores it).
func syntaxHint(data []byte) string {
	data = config.TrimByteOrderMark(data)
	var v any
	err := json.Unmarshal(data, &v)
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		if err != nil {
			return " (" + printable(err.Error()) + ")"
		}
		return ""
	}
	line, col := 1, 1
	for i := 0; i < int(se.Offset)-1 && i < len(data); i++ {
		if data[i] == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return fmt.Sprintf(" (line %d, column %d: %s)", line, col, printable(se.Error()))
}
