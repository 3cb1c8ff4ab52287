# Filters `go test -v PKG 2>&1` (make test) to one line per finished top-level test:
#
#	e2e: --- PASS: TestREADME (41.20s)
#
# A failing test prints its whole output (subtests and logs) before its --- FAIL line, a
# skipped one the last line it logged (the reason); lines outside any test (build errors,
# the package's ok/FAIL line) pass through, and after a panic or a fatal error (a test
# binary's timeout included) everything does. mawk, gawk and busybox awk; pkg=LABEL.
function out(s) { print s; fflush() }
function top(name) { sub(/\/.*/, "", name); return name }
function flushall(   k) {
	for (k in buf) {
		printf "%s", buf[k]
		delete buf[k]
	}
	fflush()
}
# reason returns the last log line ("    file.go:12: text") of a test's output.
function reason(s,   n, i, lines) {
	n = split(s, lines, "\n")
	for (i = n; i > 0; i--)
		if (lines[i] ~ /^ +[^ ]+\.go:[0-9]+: /) {
			sub(/^ +/, "", lines[i])
			return "\n" label ":     " lines[i]
		}
	return ""
}
BEGIN { label = pkg; sub(/^\.\//, "", label); cur = ""; fin = ""; raw = 0 }
raw { out($0); next }
/^(panic: |fatal error: )/ { flushall(); raw = 1; out($0); next }
/^=== (RUN|CONT|NAME|PAUSE) / {
	cur = top($3)
	fin = ""
	buf[cur] = buf[cur] $0 "\n"
	next
}
/^--- (PASS|FAIL|SKIP): / {
	name = $3
	if ($2 == "FAIL:") {
		printf "%s", buf[name]
		out(label ": " $0)
	} else if ($2 == "SKIP:") {
		out(label ": " $0 reason(buf[name]))
	} else {
		out(label ": " $0)
	}
	delete buf[name]
	if (cur == name) cur = ""
	fin = name; failed = $2 == "FAIL:"
	next
}
# The subtests' result lines, indented, follow their parent's: shown when it failed.
fin != "" && /^ / { if (failed) out($0); next }
{ fin = "" }
/^(PASS|FAIL)$/ { next }
cur != "" { buf[cur] = buf[cur] $0 "\n"; next }
{ out($0) }
END { flushall() }
