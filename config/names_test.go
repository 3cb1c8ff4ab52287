package config

import (
	"strings"
	"testing"
)

// One validator for names: rule names, the longer names `sluice serve` receives (a rule
// name or "<scope>.<name>"), and scope names (no '.').
func TestNames(t *testing.T) {
	rule, id := strings.Repeat("r", MaxRuleNameLen), strings.Repeat("s", MaxScopeNameLen)+"."+strings.Repeat("r", MaxRuleNameLen)
	for _, c := range []struct {
		name                string
		rule, ruleID, scope string
	}{
		{"per-client_1.v2", "", "", "may contain only letters, digits, '-' and '_'"},
		{"Az09-_", "", "", ""},
		{"", "is empty", "is empty", "is empty"},
		{rule, "", "", ""},
		{rule + "r", "is longer than 64 bytes", "", "is longer than 64 bytes"},
		{id, "is longer than 64 bytes", "", "is longer than 64 bytes"},
		{id + "r", "is longer than 64 bytes", "is longer than 129 bytes", "is longer than 64 bytes"},
		{"a/b", "may contain only letters, digits, '-', '_' and '.'", "may contain only letters, digits, '-', '_' and '.'", "may contain only letters, digits, '-' and '_'"},
		{"é", "may contain only letters, digits, '-', '_' and '.'", "may contain only letters, digits, '-', '_' and '.'", "may contain only letters, digits, '-' and '_'"},
	} {
		if got := CheckRuleName(c.name); got != c.rule {
			t.Errorf("CheckRuleName(%q) = %q, want %q", c.name, got, c.rule)
		}
		if got := CheckRuleID(c.name); got != c.ruleID {
			t.Errorf("CheckRuleID(%q) = %q, want %q", c.name, got, c.ruleID)
		}
		if got := checkScopeName(c.name); got != c.scope {
			t.Errorf("checkScopeName(%q) = %q, want %q", c.name, got, c.scope)
		}
	}
}
