// Command sluice is the sluice command-line tool:
//
//	sluice check FILE          validate a plugin configuration
//	sluice run [flags]         serve HTTP through the filter on an embedded Proxy-Wasm host
//	sluice serve [flags]       a rate-limit service (Envoy RLS v3) on a Redis Cluster
//	sluice simulate [flags]    replay traffic through the algorithms, write an HTML report
//	sluice version             the version, commit and Go version this binary was built from
//
// `sluice --help`, `sluice help` and `sluice CMD --help` print usage to stdout and exit 0; a
// usage error prints one line and a pointer to --help on stderr and exits 2, worded the same
// in every subcommand (flags named --NAME, as the help and README name them). Each
// subcommand lives in its own file and registers itself in commands.
package main

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime/debug"
	"sort"
	"strings"
)

// command is one subcommand. run returns the process exit status.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands is filled by init functions in the subcommand files.
var commands = map[string]command{}

// processLoggers is true in the command itself (not in tests that call dispatch): `sluice
// run` then makes its log the process's (slog's default, the log package's, gRPC's).
var processLoggers bool

func main() {
	processLoggers = true
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		if len(args) > 1 {
			if c, ok := commands[args[1]]; ok {
				return c.run([]string{"--help"}, stdout, stderr)
			}
			if args[1] == "version" {
				return runVersion([]string{"--help"}, stdout, stderr)
			}
		}
		usage(stdout)
		return 0
	case "-version", "--version", "version":
		return runVersion(args[1:], stdout, stderr)
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "sluice: unknown command %q; see 'sluice --help'\n", args[0])
		return 2
	}
	return c.run(args[1:], stdout, stderr)
}

const versionUsage = `usage: sluice version

Prints the version, the commit and the Go version this binary was built from
(also: sluice --version).
`

// runVersion is `sluice version`: the version line; --help prints its usage.
func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch a := args[0]; {
		case a == "-h" || a == "-help" || a == "--help":
			fmt.Fprint(stdout, versionUsage)
			return 0
		case strings.HasPrefix(a, "-"):
			return usageError(stderr, "version", fmt.Errorf("unknown flag %s", printable(a)))
		default:
			return usageError(stderr, "version", fmt.Errorf("unexpected argument %q", a))
		}
	}
	fmt.Fprintln(stdout, versionLine())
	return 0
}

// usageError reports a command-line mistake in one line, with a pointer to the help.
func usageError(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "sluice %s: %s; see 'sluice %s --help'\n", cmd, flagErrorText(err), cmd)
	return 2
}

// The flag package's errors name a flag with one dash; these rewrite them as the help, the
// README and `sluice check` word them: "unknown flag --x", "flag --x needs an argument",
// "invalid value "v" for flag --x: …".
var flagErrorRewrites = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`^flag provided but not defined: -+(.*)$`), "unknown flag --$1"},
	{regexp.MustCompile(`^flag needs an argument: -+(.*)$`), "flag --$1 needs an argument"},
	{regexp.MustCompile(`^(invalid (?:boolean )?value ".*" for) (?:flag )?-+([^:\s]+):`), "$1 flag --$2:"},
}

// flagErrorText is err's text with the flag package's wording rewritten (flagErrorRewrites).
func flagErrorText(err error) string {
	msg := err.Error()
	for _, r := range flagErrorRewrites {
		if r.re.MatchString(msg) {
			return r.re.ReplaceAllString(msg, r.repl)
		}
	}
	return msg
}

// versionLine describes the build from the binary's build information: module version,
// VCS revision (and whether the tree was modified) and the Go version.
func versionLine() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "sluice (no build information)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	line := "sluice " + v
	var rev, when string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		line += " commit " + rev
		if modified {
			line += " (modified)"
		}
		if when != "" {
			line += " " + when
		}
	}
	return line + " " + bi.GoVersion
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: sluice <command> [arguments]   (sluice <command> --help for its flags)")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "  %-10s %s\n", "version", "print the version, commit and Go version")
}
