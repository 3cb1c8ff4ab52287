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

const checkUsage = `usage: sluice check [--redis] FILE...

Validates sluice plugin configurations (JSON; "-" reads standard input) for
the module that will load them: sluice.wasm by default, sluice-redis.wasm with
--redis (the build with the Redis backend, whose rules have the Redis
scripts' bounds). It runs the module's own validation, so "ok" means the
module loads the configuration. Prints "ok" and one line per rule, or every
error found, one per line, each naming its JSON path; input is quoted and
escaped in both. With several files, each is checked and reported: "FILE: ok"
and its rules indented, or its errors, each line starting with FILE. Exit
status: 0 every file valid, 1 any invalid or unreadable, 2 usage error.
`

// runCheck implements `sluice check [--redis] FILE...`.
func runCheck(args []string, stdout, stderr io.Writer) int {
	build := config.BuildLocal
	var names []string
	stdinSeen := false
	for _, a := range args {
		switch {
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
	if len(names) == 0 {
		return usageError(stderr, "check", errors.New("no FILE"))
	}
	code, needsRedis := 0, false
	for _, name := range names {
		ok, redis := checkFile(name, build, len(names) > 1, stdout, stderr)
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
func checkFile(name string, build config.Build, several bool, stdout, stderr io.Writer) (ok, needsRedis bool) {
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
	for _, r := range c.Rules {
		fmt.Fprintln(stdout, indent+r.Summary())
	}
	// Each "_rules_" entry, then its own rules, indented.
	for _, sc := range c.Scopes {
		fmt.Fprintln(stdout, indent+sc.Summary())
		for _, r := range sc.Config.Rules {
			fmt.Fprintln(stdout, indent+"  "+r.Summary())
		}
	}
	return true, false
}

// configErrorLines renders a configuration error of file name as `sluice check` prints it:
// one line per error, "NAME: PATH: MESSAGE", input quoted and escaped. needsRedis reports a
// Redis rule refused by the build without the Redis backend.
func configErrorLines(name string, data []byte, err error) (lines []string, needsRedis bool) {
	var errs config.Errors
	if !errors.As(err, &errs) {
		return []string{name + ": " + printable(err.Error())}, false
	}
	for _, e := range errs {
		msg := e.Error()
		if e.Path == "" && e.Msg == "is not valid JSON" {
			msg += syntaxHint(data)
		}
		needsRedis = needsRedis || strings.HasPrefix(e.Msg, `"redis" needs sluice-redis.wasm`)
		lines = append(lines, name+": "+msg)
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
// the standard library's decoder to say where.
func syntaxHint(data []byte) string {
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
