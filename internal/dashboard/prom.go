package dashboard

import (
	"bufio"
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Label is one name="value" pair of a sample, with the value unescaped.
type Label struct {
	Name, Value string
}

// Sample is one line of the Prometheus text exposition format.
type Sample struct {
	Name   string
	Labels []Label // sorted by name, no duplicates
	Value  float64 // may be NaN or ±Inf
}

// Key returns the sample's series identity: the name followed by the sorted labels in
// Prometheus syntax ("m", `m{a="x",b="y\"z"}`). Two samples of the same series have the
// same key however their labels were ordered or spaced in the text.
func (s Sample) Key() string {
	if len(s.Labels) == 0 {
		return s.Name
	}
	var b strings.Builder
	b.WriteString(s.Name)
	b.WriteByte('{')
	for i, l := range s.Labels {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.Name)
		b.WriteString(`="`)
		b.WriteString(escapeLabelValue(l.Value))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// Label returns the value of the named label and whether the sample has it.
func (s Sample) Label(name string) (string, bool) {
	for _, l := range s.Labels {
		if l.Name == name {
			return l.Value, true
		}
	}
	return "", false
}

func escapeLabelValue(v string) string {
	if !strings.ContainsAny(v, "\\\"\n") {
		return v
	}
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}

// LineError describes a line ParseText skipped.
type LineError struct {
	Line int // 1-based
	Msg  string
}

func (e LineError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Msg) }

// MaxLineErrors bounds the errors ParseText returns; further bad lines are still skipped
// (and counted in the last error's message).
const MaxLineErrors = 20

// ParseText reads the Prometheus text exposition format (version 0.0.4): one sample per
// line as `name[{label="value",...}] value [timestamp]`. Comment lines (# HELP, # TYPE or
// any other #) and blank lines are ignored. Values may be NaN, +Inf or -Inf. A malformed
// line is skipped and reported in errs (at most MaxLineErrors of them); it never stops
// the parse, and nothing in the input can make ParseText panic.
func ParseText(text []byte) (samples []Sample, errs []LineError) {
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	skipped := 0
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseLine(line)
		if err != "" {
			skipped++
			if len(errs) < MaxLineErrors {
				errs = append(errs, LineError{n, err})
			}
			continue
		}
		samples = append(samples, s)
	}
	if err := sc.Err(); err != nil {
		// Only a line longer than the 1 MiB buffer gets here; what was read is kept.
		skipped++
		if len(errs) < MaxLineErrors {
			errs = append(errs, LineError{n + 1, err.Error()})
		}
	}
	if skipped > len(errs) && len(errs) > 0 {
		last := &errs[len(errs)-1]
		last.Msg += fmt.Sprintf(" (and %d more malformed lines)", skipped-len(errs))
	}
	return samples, errs
}

func isNameStart(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isNameChar(c byte) bool { return isNameStart(c) || (c >= '0' && c <= '9') }

// parseLine parses one non-comment line; a non-empty string is the reason it is malformed.
func parseLine(line string) (Sample, string) {
	var s Sample
	i := 0
	for i < len(line) && isNameChar(line[i]) {
		i++
	}
	if i == 0 || !isNameStart(line[0]) {
		return s, "no metric name"
	}
	s.Name = line[:i]
	if i < len(line) && line[i] == '{' {
		labels, next, err := parseLabels(line, i+1)
		if err != "" {
			return s, err
		}
		s.Labels, i = labels, next
	}
	rest := line[i:]
	if rest == "" || (rest[0] != ' ' && rest[0] != '\t') {
		return s, "no value after " + strconv.Quote(s.Name)
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 || len(fields) > 2 {
		return s, "want a value and an optional timestamp"
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, "value " + strconv.Quote(fields[0]) + " is not a number"
	}
	if len(fields) == 2 {
		if _, err := strconv.ParseInt(fields[1], 10, 64); err != nil {
			return s, "timestamp " + strconv.Quote(fields[1]) + " is not an integer"
		}
	}
	s.Value = v
	sort.Slice(s.Labels, func(a, b int) bool { return s.Labels[a].Name < s.Labels[b].Name })
	for k := 1; k < len(s.Labels); k++ {
		if s.Labels[k].Name == s.Labels[k-1].Name {
			return s, "duplicate label " + strconv.Quote(s.Labels[k].Name)
		}
	}
	return s, ""
}

// parseLabels parses `name="value",...}` starting at line[i] (just after '{') and returns
// the labels and the index after '}'.
func parseLabels(line string, i int) ([]Label, int, string) {
	var labels []Label
	for {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		if i >= len(line) {
			return nil, 0, "unterminated label set"
		}
		if line[i] == '}' {
			return labels, i + 1, ""
		}
		start := i
		for i < len(line) && isNameChar(line[i]) && line[i] != ':' {
			i++
		}
		if i == start || (line[start] >= '0' && line[start] <= '9') {
			return nil, 0, "bad label name at column " + strconv.Itoa(start+1)
		}
		name := line[start:i]
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		if i+1 >= len(line) || line[i] != '=' {
			return nil, 0, "want = after label " + strconv.Quote(name)
		}
		i++
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		if i >= len(line) || line[i] != '"' {
			return nil, 0, "want a quoted value for label " + strconv.Quote(name)
		}
		i++
		var v strings.Builder
		closed := false
		for i < len(line) && !closed {
			c := line[i]
			switch c {
			case '"':
				closed = true
			case '\\':
				if i+1 >= len(line) {
					return nil, 0, "unterminated value of label " + strconv.Quote(name)
				}
				i++
				switch line[i] {
				case '\\':
					v.WriteByte('\\')
				case '"':
					v.WriteByte('"')
				case 'n':
					v.WriteByte('\n')
				default:
					return nil, 0, "bad escape \\" + string(line[i]) + " in label " + strconv.Quote(name)
				}
			default:
				v.WriteByte(c)
			}
			i++
		}
		if !closed {
			return nil, 0, "unterminated value of label " + strconv.Quote(name)
		}
		labels = append(labels, Label{name, v.String()})
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		if i < len(line) && line[i] == ',' {
			i++
			continue
		}
		if i < len(line) && line[i] == '}' {
			return labels, i + 1, ""
		}
		return nil, 0, "want , or } after label " + strconv.Quote(name)
	}
}

// PromName is the Prometheus name the host gives a guest metric named name (see package
// host: characters outside [a-zA-Z0-9_:] become '_', and so does a leading digit). The
// dashboard uses it to find a rule's counters: the filter defines "sluice.RULE.denied",
// which the host exposes as sluice_RULE_denied with RULE's other characters replaced.
func PromName(name string) string {
	b := []byte(name)
	for i, c := range b {
		ok := c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9' && i > 0)
		if !ok {
			b[i] = '_'
		}
	}
	return string(b)
}
