# Filters `go vet -v ./... 2>&1` (make test) and `go build -v … 2>&1` (make build): on a
# cold build cache go prints each package
# it compiles, one import path a line; this prints a count every 50 of them instead, and
# every other line (vet's findings, errors) as it comes. Nothing when the cache is warm.
function out(s) { print s; fflush() }
/^[A-Za-z0-9_.~\/+-]+$/ {
	n++
	if (n % 50 == 0) out("compiling dependencies: " n " packages so far (" $0 ")")
	next
}
{ out($0) }
END { if (n) out("compiled " n (n == 1 ? " package" : " packages")) }
