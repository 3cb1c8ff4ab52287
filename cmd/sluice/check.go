package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/sluice-proxy/sluice/config"
)

func init() {
	commands["check"] = command{summary: "validate a plugin configuration", run: runCheck}
}

// stdin is read by `sluice check -`; tests replace it.
var stdin io.Reader = os.Stdin

const checkUsage = `usage: sluice check FILE

Validates a sluice plugin configuration (JSON; "-" reads standard input).
Prints "ok" and one line per rule, or every error found, one per line,
each naming its JSON path. Exit status: 0 valid, 1 invalid or unreadable,
2 usage error.
`

// runCheck implements `sluice check FILE`.
func runCheck(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprint(stdout, checkUsage)
		return 0
	}
	if len(args) != 1 || args[0] == "" || len(args[0]) > 1 && args[0][0] == '-' {
		fmt.Fprint(stderr, checkUsage)
		return 2
	}
	name := args[0]
	var data []byte
	var err error
	if name == "-" {
		name = "<stdin>"
		data, err = io.ReadAll(io.LimitReader(stdin, config.MaxConfigSize+1))
	} else {
		data, err = os.ReadFile(name)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice check: cannot read configuration: %v\n", err)
		return 1
	}
	c, err := config.Parse(data)
	if err != nil {
		var errs config.Errors
		if !errors.As(err, &errs) {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			return 1
		}
		for _, e := range errs {
			msg := e.Error()
			if e.Path == "" && e.Msg == "is not valid JSON" {
				msg += syntaxHint(data)
			}
			fmt.Fprintf(stderr, "%s: %s\n", name, msg)
		}
		return 1
	}
	fmt.Fprintln(stdout, "ok")
	for _, r := range c.Rules {
		fmt.Fprintln(stdout, r.Summary())
	}
	return 0
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
			return " (" + err.Error() + ")"
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
	return fmt.Sprintf(" (line %d, column %d: %v)", line, col, se)
}
