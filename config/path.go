package config

// Path normalization: the path as Envoy's HTTP connection manager leaves it
// with normalize_path: true and merge_slashes: true (and
// path_with_escaped_slashes_action at its default, KEEP_UNCHANGED), so that
// path_prefix and the path key part see what the upstream sees: /%68, //h,
// /./h, /x/../h and /%2568/../h are all /h.
//
// Envoy (source/common/http/path_utility.cc, PathUtil::canonicalPath and
// PathUtil::mergeSlashes, called from ConnectionManagerUtility::
// maybeNormalizePath) does, on the part of :path before '?':
//
//  1. stripParametersFromDotSegments (Envoy ≥ 1.38.4 / 1.39.1, runtime guard
//     strip_dotdot_segments_with_parameters, on by default): a '/'-separated
//     segment that starts with "..;" becomes "..", one that starts with ".;"
//     becomes ".".
//  2. url::CanonicalizePath of the Chromium URL library (googleurl
//     dd4080fec, 2022-11-03, the version Envoy pins): a leading '/' is added
//     when missing; '\' becomes '/'; "." and ".." segments (also written
//     %2e, any case) are removed RFC 3986-style, ".." never climbing above
//     the root; a percent escape of an unreserved character (A-Z a-z 0-9
//     - . _ ~) is decoded, every other valid escape is kept exactly as
//     written (%2F and %5C included, hex case unchanged), an invalid escape
//     ("%zz", a trailing "%") is kept literally, and a decoded character
//     that would form a new escape with a preceding invalid '%' turns that
//     '%' into "%25" (CheckForNestedEscapes); bytes that are not allowed
//     in a path (controls, space, " # < > ` { | } ^, DEL, non-ASCII) are
//     percent-escaped with upper-case hex.
//  3. mergeSlashes: if the result contains "//", it becomes "/" + its
//     non-empty segments joined by "/" + "/" if it ended with '/' (so "//"
//     itself stays "//", as in Envoy).
//
// Decoding is one pass: %2568 is the three characters %68 after
// normalization, never h — what Envoy forwards and what the upstream then
// decodes once.
//
// Where Envoy refuses a request instead (a NUL byte or %00 in the path: 400),
// or does not normalize at all (normalize_path off, or `sluice run`), this
// normalization still applies and never fails: the refused cases get the same
// output as Envoy computes before refusing (the NUL escaped as %00), and a
// fragment ('#' and after; Envoy refuses it by default) is cut off like the
// query. So a request is compared with a rule in the form the upstream
// resolves it to, whatever the proxy in front does.

// Character classes of a path byte (Chromium's kPathCharLookup, 2022).
const (
	pcPass     = 0 // copied as is
	pcUnescape = 1 // copied as is; its percent escape is decoded
	pcEscape   = 2 // percent-escaped in the output
	pcSpecial  = 3 // '.', '%', '\' (handled by the normalizer itself)
	pcInvalid  = 4 // NUL: escaped; Envoy refuses the request
)

var pathClass = func() (t [256]uint8) {
	for c := 0; c < 256; c++ {
		switch {
		case c == 0:
			t[c] = pcInvalid
		case c < 0x20 || c >= 0x7f:
			t[c] = pcEscape
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9':
			t[c] = pcUnescape
		}
	}
	for _, c := range []byte("-_~") {
		t[c] = pcUnescape
	}
	for _, c := range []byte(" \"#<>?`{|}^") {
		t[c] = pcEscape
	}
	for _, c := range []byte(".%\\") {
		t[c] = pcSpecial
	}
	return t
}()

// PathPart returns the part of a :path value before the first '?' or '#'.
func PathPart(path string) string {
	for i := 0; i < len(path); i++ {
		if path[i] == '?' || path[i] == '#' {
			return path[:i]
		}
	}
	return path
}

// PathIsNormal reports whether p, a path without query or fragment, is its
// own normal form for certain (AppendNormalPath would copy it unchanged). It
// is a fast, conservative test: false means "normalize to find out". An
// empty p is not normal (it normalizes to "/").
func PathIsNormal(p string) bool { return pathIsNormal(p) }

func pathIsNormal[S string | []byte](p S) bool {
	if len(p) == 0 || p[0] != '/' {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch pathClass[c] {
		case pcPass, pcUnescape:
			if c == '/' && i > 0 && p[i-1] == '/' {
				return false
			}
		case pcSpecial:
			switch c {
			case '.':
				if p[i-1] != '/' {
					continue
				}
				// A segment starting with '.': ".", "..", ".;…" and "..;…"
				// change; ".well-known", "...", "..a" do not.
				j := i + 1
				if j < len(p) && p[j] == '.' {
					j++
				}
				if j == len(p) || p[j] == '/' || p[j] == ';' || p[j] == '%' {
					return false
				}
			case '%':
				// An escape that is kept as written; anything else
				// (an unreserved character, a dot, an invalid escape)
				// changes or needs a closer look.
				v, ok := decodeEscape(p, i)
				if !ok || v == '.' || pathClass[v] == pcUnescape {
					return false
				}
				i += 2
			default:
				return false
			}
		default:
			return false
		}
	}
	return true
}

// NormalizePath returns the normal form of p (a :path value or its path
// part; anything from the first '?' or '#' is ignored). It allocates; the
// filter uses AppendNormalPath with a reused buffer instead.
func NormalizePath(p string) string {
	p = PathPart(p)
	if PathIsNormal(p) {
		return p
	}
	return string(AppendNormalPath(nil, p))
}

// maxPasses bounds the passes of AppendNormalPath. Every pass after the
// first only removes bytes, so a path settles in at most a few; the bound is
// a guard, never reached by any input we know of.
const maxPasses = 16

// AppendNormalPath appends the normal form of p to dst and returns the
// extended slice. p is a :path value or its path part (anything from the
// first '?' or '#' is ignored). It never fails; see the comment at the top
// of this file for what it does. It allocates only when dst must grow.
//
// The normal form is Envoy's normalization applied until nothing changes.
// One pass is what Envoy forwards, and for nearly every path a second pass
// changes nothing; where it would (Envoy splits segments for ".;" on '/'
// only, before it turns '\' into '/': "/h\..;/x" becomes "/h/..;/x", which
// a second pass — and a Tomcat upstream — resolves to "/x"), the filter uses
// the settled form, so that it sees the same path whether or not an Envoy in
// front has normalized it already.
func AppendNormalPath(dst []byte, p string) []byte {
	start := len(dst)
	dst = normalizeOnce(dst, PathPart(p))
	for pass := 1; pass < maxPasses && !pathIsNormal(dst[start:]); pass++ {
		mid := len(dst)
		dst = normalizeOnce(dst, dst[start:mid])
		if string(dst[start:mid]) == string(dst[mid:]) {
			return dst[:mid]
		}
		n := copy(dst[start:], dst[mid:])
		dst = dst[:start+n]
	}
	return dst
}

// normalizeOnce appends one pass of Envoy's normalization of the path p (no
// query or fragment) to dst.
func normalizeOnce[S string | []byte](dst []byte, p S) []byte {
	start := len(dst)
	if hasDotParams(p) {
		// Step 1 writes into dst; step 2 reads it from there and appends
		// its output after it, which is then moved down to start.
		dst = appendStrippedDotParams(dst, p)
		mid := len(dst)
		dst = canonicalize(dst, dst[start:mid])
		n := copy(dst[start:], dst[mid:])
		dst = dst[:start+n]
	} else {
		dst = canonicalize(dst, p)
	}
	return mergeSlashes(dst, start)
}

// hasDotParams reports whether step 1 has anything to do: Envoy runs it only
// when the path contains ".;".
func hasDotParams[S string | []byte](p S) bool {
	for i := 0; i+1 < len(p); i++ {
		if p[i] == '.' && p[i+1] == ';' {
			return true
		}
	}
	return false
}

// appendStrippedDotParams appends p with every '/'-separated segment that
// starts with "..;" replaced by ".." and every one that starts with ".;" by
// "." (PathUtil::stripParametersFromDotSegments).
func appendStrippedDotParams[S string | []byte](dst []byte, p S) []byte {
	for seg := 0; seg <= len(p); {
		end := seg
		for end < len(p) && p[end] != '/' {
			end++
		}
		n := end - seg
		switch {
		case n >= 3 && p[seg] == '.' && p[seg+1] == '.' && p[seg+2] == ';':
			dst = append(dst, '.', '.')
		case n >= 2 && p[seg] == '.' && p[seg+1] == ';':
			dst = append(dst, '.')
		default:
			dst = append(dst, p[seg:end]...)
		}
		if end == len(p) {
			break
		}
		dst = append(dst, '/')
		seg = end + 1
	}
	return dst
}

// canonicalize appends the canonical form of the path p to dst
// (url::CanonicalizePath: DoPath and DoPartialPath of Chromium's
// url_canon_path.cc as Envoy links it).
func canonicalize[S string | []byte](dst []byte, p S) []byte {
	begin := len(dst) // the output's first '/' (path_begin_in_output)
	if len(p) == 0 {
		return append(dst, '/')
	}
	if p[0] != '/' && p[0] != '\\' {
		dst = append(dst, '/')
	}
	lastInvalidPercent := -1 // output index of a '%' that began no valid escape
	for i := 0; i < len(p); i++ {
		c := p[i]
		class := pathClass[c]
		if class == pcPass || class == pcUnescape {
			dst = append(dst, c)
			continue
		}
		if n := dotLen(p, i); n > 0 {
			if len(dst) > begin && dst[len(dst)-1] == '/' {
				kind, consumed := classifyAfterDot(p, i+n)
				switch kind {
				case dotNone:
					dst = append(dst, '.')
					i += n - 1
				case dotCurrent:
					i += n + consumed - 1
				case dotParent:
					dst = backUpToPreviousSlash(dst, begin)
					i += n + consumed - 1
				}
			} else {
				dst = append(dst, '.')
				i += n - 1
			}
			continue
		}
		switch {
		case c == '\\':
			dst = append(dst, '/')
		case c == '%':
			v, ok := decodeEscape(p, i)
			if !ok {
				lastInvalidPercent = len(dst)
				dst = append(dst, '%')
				continue
			}
			if pathClass[v] == pcUnescape {
				dst = append(dst, v)
				i += 2
				if lastInvalidPercent >= 0 && lastInvalidPercent >= len(dst)-3 {
					dst = fixNestedEscape(dst, p, i+1, lastInvalidPercent)
				}
				continue
			}
			// Kept exactly as written (hex case included); %00 is where
			// Envoy refuses the request.
			dst = append(dst, '%', p[i+1], p[i+2])
			i += 2
		default: // pcEscape, pcInvalid
			dst = append(dst, '%', upperHex[c>>4], upperHex[c&15])
		}
	}
	return dst
}

const upperHex = "0123456789ABCDEF"

// dotLen is Chromium's IsDot: 1 for '.', 3 for "%2e" / "%2E", else 0.
func dotLen[S string | []byte](p S, i int) int {
	if p[i] == '.' {
		return 1
	}
	if p[i] == '%' && i+3 <= len(p) && p[i+1] == '2' && (p[i+2] == 'e' || p[i+2] == 'E') {
		return 3
	}
	return 0
}

const (
	dotNone    = iota // part of a name
	dotCurrent        // "."
	dotParent         // ".."
)

// classifyAfterDot is Chromium's ClassifyAfterDot: what a dot that follows a
// slash in the output means, given the input after it. consumed is the input
// it takes beyond the first dot (a second dot, a slash).
func classifyAfterDot[S string | []byte](p S, after int) (kind, consumed int) {
	if after == len(p) {
		return dotCurrent, 0
	}
	if p[after] == '/' || p[after] == '\\' {
		return dotCurrent, 1
	}
	if n := dotLen(p, after); n > 0 {
		next := after + n
		if next == len(p) {
			return dotParent, n
		}
		if p[next] == '/' || p[next] == '\\' {
			return dotParent, n + 1
		}
	}
	return dotNone, 0
}

// backUpToPreviousSlash removes the last segment of the output, which ends
// with '/', keeping the slash before it; at the first slash it does nothing
// (".." never climbs above the root).
func backUpToPreviousSlash(dst []byte, begin int) []byte {
	i := len(dst) - 1
	if i <= begin {
		return dst
	}
	i--
	for dst[i] != '/' && i > begin {
		i--
	}
	return dst[:i+1]
}

// decodeEscape decodes "%XX" at p[i].
func decodeEscape[S string | []byte](p S, i int) (byte, bool) {
	if i+3 > len(p) {
		return 0, false
	}
	h, l := p[i+1], p[i+2]
	if !isHex(h) || !isHex(l) {
		return 0, false
	}
	return fromHex(h)<<4 | fromHex(l), true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func fromHex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// fixNestedEscape is Chromium's CheckForNestedEscapes. The output ends with
// a '%' (at pct) that began no valid escape, followed by one or two
// characters, the last of them just decoded. If those characters (plus the
// next input character when there is only one) now form a valid escape, the
// '%' becomes "%25", so that decoding the output again cannot produce
// something the input did not say ("%%30%30" must not become "%00").
func fixNestedEscape[S string | []byte](dst []byte, p S, next, pct int) []byte {
	length := len(dst)
	last := dst[length-1]
	appendNext := pct == length-2
	if appendNext {
		if next == len(p) || p[next] >= 0x80 {
			return dst
		}
		dst = append(dst, p[next])
	}
	if _, ok := decodeEscape(dst, pct); ok {
		if !appendNext {
			dst = append(dst, dst[pct+1])
		}
		dst[pct+1] = '2'
		dst[pct+2] = '5'
		return append(dst, last)
	}
	if appendNext {
		dst = dst[:length]
	}
	return dst
}

// mergeSlashes applies PathUtil::mergeSlashes in place to dst[start:], a
// canonical path (it starts with '/').
func mergeSlashes(dst []byte, start int) []byte {
	p := dst[start:]
	double := false
	for i := 1; i < len(p); i++ {
		if p[i] == '/' && p[i-1] == '/' {
			double = true
			break
		}
	}
	if !double {
		return dst
	}
	trailing := p[len(p)-1] == '/'
	w := 1 // p[0] is '/'
	first := true
	for i := 0; i < len(p); {
		for i < len(p) && p[i] == '/' {
			i++
		}
		j := i
		for j < len(p) && p[j] != '/' {
			j++
		}
		if j > i {
			if !first {
				p[w] = '/'
				w++
			}
			first = false
			w += copy(p[w:], p[i:j])
		}
		i = j
	}
	if trailing {
		p[w] = '/'
		w++
	}
	return dst[:start+w]
}
