package config

import "strconv"

// The names of rules and scopes. A rule's counters are named after it
// (sluice.<rule>.allowed, or sluice.<scope>.<rule>.allowed for a rule of a
// "_rules_" scope), and the rate-limit service keys a rule's counters in
// Redis by "<domain>/<rule>": a name never contains '/', so such a key never
// equals a configured descriptor's "<domain>/…".

// MaxRuleIDLen bounds the name a rule has outside its configuration — its
// name, or "<scope>.<name>" for a rule of a "_rules_" scope — as the
// rate-limit service (`sluice serve`) accepts it in an inline descriptor.
const MaxRuleIDLen = MaxScopeNameLen + 1 + MaxRuleNameLen

// CheckRuleName reports what is wrong with s as a rule name, as the end of
// a sentence that names it ("is empty"), or "" if nothing is: 1 to
// MaxRuleNameLen bytes of letters, digits, '-', '_' and '.'.
func CheckRuleName(s string) string { return checkName(s, MaxRuleNameLen, true) }

// CheckRuleID is CheckRuleName for the name a rule has outside its
// configuration (MaxRuleIDLen): what `sluice serve` accepts as sluice.rule.
func CheckRuleID(s string) string { return checkName(s, MaxRuleIDLen, true) }

// checkScopeName is CheckRuleName for a scope's name: no '.', which
// separates it from the rule's name, and at most MaxScopeNameLen bytes.
func checkScopeName(s string) string { return checkName(s, MaxScopeNameLen, false) }

func checkName(s string, maxLen int, dot bool) string {
	if s == "" {
		return "is empty"
	}
	if len(s) > maxLen {
		return "is longer than " + strconv.Itoa(maxLen) + " bytes"
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' && dot) {
			if dot {
				return "may contain only letters, digits, '-', '_' and '.'"
			}
			return "may contain only letters, digits, '-' and '_'"
		}
	}
	return ""
}
