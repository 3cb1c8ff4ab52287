package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/config/configtest"
)

// TestMutatedConfigurations parses 2,000 hostile mutations of valid
// configurations (plus the valid ones and the boundaries) for both builds
// and checks every error: one line per entry (so no input can forge a
// line), nothing unprintable (configtest.CheckText), and a path in the
// documented syntax (configtest.PathNames: a name that is not plain can
// only be written quoted) whose quoted names unquote to members of the
// document. Successful parses must summarise their rules printably.
func TestMutatedConfigurations(t *testing.T) {
	cases := append(append(configtest.Valid(), configtest.Boundaries()...), configtest.Mutations(1, 2000)...)
	var refused, quotedNames, accepted int
	for _, tc := range cases {
		keys := memberNames(tc.JSON)
		for _, build := range []config.Build{config.BuildLocal, config.BuildRedis} {
			c, err := config.ParseFor(tc.JSON, build)
			if err == nil {
				accepted++
				for _, r := range c.Rules {
					if e := configtest.CheckText(r.Summary()); e != nil || strings.Contains(r.Summary(), "\n") {
						t.Errorf("%s (%v): summary: %v", tc.Name, build, e)
					}
				}
				continue
			}
			refused++
			var errs config.Errors
			if !errors.As(err, &errs) || c != nil {
				t.Fatalf("%s (%v): %T %v", tc.Name, build, err, err)
			}
			text := err.Error()
			if e := configtest.CheckText(text); e != nil {
				t.Errorf("%s (%v): %v", tc.Name, build, e)
			}
			if n := strings.Count(text, "\n"); n != len(errs)-1 {
				t.Errorf("%s (%v): %d lines for %d errors:\n%s", tc.Name, build, n+1, len(errs), text)
			}
			for _, e := range errs {
				names, cut, perr := configtest.PathNames(e.Path)
				if perr != nil {
					t.Errorf("%s (%v): %v", tc.Name, build, perr)
					continue
				}
				for i, name := range names {
					// A quoted name can only come from the document (the
					// contract's names are plain).
					if plain(name) && !cut[i] {
						continue
					}
					quotedNames++
					if !keys.has(name, cut[i]) {
						t.Errorf("%s (%v): path %s names %q, not a member of the document", tc.Name, build, e.Path, name)
					}
				}
			}
		}
	}
	t.Logf("%d configurations × 2 builds: %d accepted, %d refused, %d quoted names in paths", len(cases), accepted, refused, quotedNames)
	if accepted < 20 || refused < 2000 || quotedNames < 500 {
		t.Errorf("the corpus does not exercise both outcomes and quoted names: %d accepted, %d refused, %d quoted", accepted, refused, quotedNames)
	}
}

// names is the set of member names of a document (as gjson decodes them).
type names map[string]bool

func (n names) has(name string, prefix bool) bool {
	if !prefix {
		return n[name]
	}
	for k := range n {
		if strings.HasPrefix(k, name) {
			return true
		}
	}
	return false
}

func memberNames(data []byte) names {
	n := names{}
	if !gjson.ValidBytes(data) {
		return n
	}
	var walk func(v gjson.Result)
	walk = func(v gjson.Result) {
		v.ForEach(func(k, x gjson.Result) bool {
			if v.IsObject() {
				n[k.String()] = true
			}
			if x.IsObject() || x.IsArray() {
				walk(x)
			}
			return true
		})
	}
	walk(gjson.ParseBytes(data))
	return n
}

// plain reports whether a path writes name bare (letters, digits, '_', '-').
func plain(name string) bool {
	names, cut, err := configtest.PathNames(name)
	return err == nil && len(names) == 1 && names[0] == name && !cut[0]
}
