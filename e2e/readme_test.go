package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeBlock is a command block of README.md or of a docs/*.md page marked to be checked:
//
//	<!-- check [server] [output] -->
//	```sh
//	commands
//	```
//
// server: run while `make run` serves (on free ports, substituted for 127.0.0.1:8080 and
// 127.0.0.1:9901 in the block). output: each command must print the "# " comment lines
// below it (text after "<-" is a note).
type readmeBlock struct {
	line           int // of the opening fence, 1-based
	server, output bool
	body           string
}

// parseReadmeBlocks returns the marked blocks of a document (name, for errors), or an error
// for a marker that is not followed by a fenced sh block or that has an unknown word.
func parseReadmeBlocks(name, text string) ([]readmeBlock, error) {
	lines := strings.Split(text, "\n")
	var blocks []readmeBlock
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "<!-- check") {
			continue
		}
		words := strings.Fields(strings.TrimSuffix(strings.TrimPrefix(l, "<!--"), "-->"))
		if !strings.HasSuffix(l, "-->") || words[0] != "check" {
			return nil, fmt.Errorf("%s:%d: malformed marker %q", name, i+1, l)
		}
		b := readmeBlock{line: i + 2}
		for _, w := range words[1:] {
			switch w {
			case "server":
				b.server = true
			case "output":
				b.output = true
			default:
				return nil, fmt.Errorf("%s:%d: unknown word %q in %q", name, i+1, w, l)
			}
		}
		if i+1 >= len(lines) || (lines[i+1] != "```sh" && lines[i+1] != "```bash") {
			return nil, fmt.Errorf("%s:%d: %q is not followed by a ```sh block", name, i+1, l)
		}
		end := i + 2
		for end < len(lines) && lines[end] != "```" {
			end++
		}
		if end == len(lines) {
			return nil, fmt.Errorf("%s:%d: unterminated block", name, i+2)
		}
		b.body = strings.Join(lines[i+2:end], "\n") + "\n"
		blocks = append(blocks, b)
		i = end
	}
	return blocks, nil
}

// readmeStep is one command of an output block and the lines it must print.
type readmeStep struct {
	cmd  string
	want []string
}

// readmeSteps splits an output block into commands (a line ending in \ continues) and the
// "# " comment lines after each; comments before the first command are notes.
func readmeSteps(body string) []readmeStep {
	var steps []readmeStep
	cont := false
	for _, l := range strings.Split(strings.TrimRight(body, "\n"), "\n") {
		switch {
		case cont:
			steps[len(steps)-1].cmd += "\n" + l
		case strings.TrimSpace(l) == "":
			continue
		case strings.HasPrefix(l, "#"):
			if len(steps) == 0 {
				continue
			}
			w := strings.TrimPrefix(strings.TrimPrefix(l, "#"), " ")
			if i := strings.Index(w, "<-"); i >= 0 {
				w = w[:i]
			}
			steps[len(steps)-1].want = append(steps[len(steps)-1].want, strings.TrimRight(w, " "))
		default:
			steps = append(steps, readmeStep{cmd: l})
		}
		cont = strings.HasSuffix(l, "\\")
	}
	return steps
}

func TestReadmeBlocksParse(t *testing.T) {
	const doc = "text\n<!-- check server output -->\n```sh\n# a note\ncurl -s x \\\n  -o y\n# 200 OK      <- the status\n#\n# b\necho\n```\n<!-- check -->\n```sh\nmake build\n```\n```sh\nnot marked\n```\n"
	blocks, err := parseReadmeBlocks("doc.md", doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 2 || !blocks[0].server || !blocks[0].output || blocks[1].server || blocks[1].output || blocks[1].body != "make build\n" || blocks[0].line != 3 {
		t.Fatalf("blocks %+v", blocks)
	}
	steps := readmeSteps(blocks[0].body)
	if len(steps) != 2 || steps[0].cmd != "curl -s x \\\n  -o y" || strings.Join(steps[0].want, "|") != "200 OK||b" || steps[1].cmd != "echo" || steps[1].want != nil {
		t.Fatalf("steps %q", steps)
	}
	cmds := goTestCommands("run `go test ./filter -run '^$' -bench\n'A(B)?$/x|C' -count 3` or\n```sh\nX=1 go test ./e2e -run 'T|U/v' -v  # note\n```\nprose go test ./x -run Y\n")
	if len(cmds) != 2 || cmds[0].pkgs[0] != "./filter" || cmds[0].flags["-bench"] != "A(B)?$/x|C" || cmds[1].line != 4 || cmds[1].flags["-run"] != "T|U/v" ||
		strings.Join(topAlternatives(firstLevel(cmds[1].flags["-run"])), ",") != "T,U" || strings.Join(topAlternatives(firstLevel("(A|B)[/|]C/D")), ",") != "(A|B)[/|]C" {
		t.Fatalf("commands %+v", cmds)
	}
	for _, bad := range []string{"<!-- check -->\ntext\n", "<!-- check -->\n```sh\nx\n", "<!-- check serve -->\n```sh\nx\n```\n", "<!-- checked -->\n```sh\nx\n```\n"} {
		if _, err := parseReadmeBlocks("bad.md", bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestREADME runs the marked command blocks of README.md, then those of every docs/*.md page
// (in name order), in order, on a copy of the repository's files (what a fresh clone holds), as
// a new user would copy them: every command runs in the repository's root, and a page's
// blocks may build on README's (dist/ is built by then).
func TestREADME(t *testing.T) {
	skipShort(t, "runs the documents' commands (bash, make)")
	root, err := moduleRoot("go")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(pages)
	type doc struct {
		name   string
		blocks []readmeBlock
	}
	var docs []doc
	for _, p := range append([]string{filepath.Join(root, "README.md")}, pages...) {
		name, _ := filepath.Rel(root, p)
		text, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := parseReadmeBlocks(name, string(text))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, doc{name, blocks})
	}
	if n := len(docs[0].blocks); n < 3 {
		t.Fatalf("README.md has %d marked blocks; the quick start, build and simulate blocks should be marked", n)
	}
	dir := t.TempDir()
	if err := copyRepo(root, dir); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	for _, d := range docs {
		for _, b := range d.blocks {
			runReadmeBlock(ctx, t, dir, d.name, b)
			if t.Failed() {
				return // later blocks build on earlier ones
			}
		}
	}
}

// runReadmeBlock runs one marked block of document name in dir (see readmeBlock).
func runReadmeBlock(ctx context.Context, t *testing.T, dir, name string, b readmeBlock) {
	t.Helper()
	start := time.Now()
	body := b.body
	if b.server {
		listen, admin := freeAddr(t), freeAddr(t)
		body = strings.NewReplacer("127.0.0.1:8080", listen, "127.0.0.1:9901", admin).Replace(body)
		stop := startMakeRun(ctx, t, dir, listen, admin)
		defer stop()
	}
	defer func() { t.Logf("%s:%d: %v", name, b.line, time.Since(start).Round(time.Millisecond)) }()
	if !b.output {
		if out, err := runShell(ctx, dir, "set -eu\n"+body); err != nil {
			t.Errorf("%s:%d: block failed: %v\n%s", name, b.line, err, out)
		}
		return
	}
	for _, s := range readmeSteps(body) {
		out, err := runShell(ctx, dir, s.cmd)
		if err != nil {
			t.Errorf("%s:%d: %s: %v\n%s", name, b.line, s.cmd, err, out)
			continue
		}
		if s.want == nil {
			continue
		}
		var got []string
		for _, l := range strings.Split(strings.TrimRight(out, "\r\n"), "\n") {
			got = append(got, strings.TrimRight(l, " \r"))
		}
		if strings.Join(got, "\n") != strings.Join(s.want, "\n") {
			t.Errorf("%s:%d: %s printed\n%s\n%s says\n%s", name, b.line, s.cmd, strings.Join(got, "\n"), name, strings.Join(s.want, "\n"))
		}
	}
}

// runShell runs script with bash -o pipefail in dir and returns its stdout and stderr.
func runShell(ctx context.Context, dir, script string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", script)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	err := cmd.Run()
	if err != nil && stderr.Len() > 0 {
		err = fmt.Errorf("%v; stderr:\n%s", err, stderr.String())
	}
	return stdout.String(), err
}

// startMakeRun starts `make run` in dir on the given addresses and waits until its admin
// server reports healthy; the returned function stops it (SIGINT to its process group).
func startMakeRun(ctx context.Context, t *testing.T, dir, listen, admin string) func() {
	t.Helper()
	cmd := exec.Command("make", "run", "LISTEN="+listen, "ADMIN="+admin)
	cmd.Dir = dir
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stop := func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		select {
		case err := <-done:
			t.Fatalf("make run exited before serving: %v\n%s", err, log.String())
		case <-ctx.Done():
			stop()
			t.Fatalf("make run did not serve before the deadline\n%s", log.String())
		case <-time.After(100 * time.Millisecond):
		}
		// /healthz on the admin server: a request to the proxy would spend quota.
		if resp, err := client.Get("http://" + admin + "/healthz"); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return stop
			}
		}
	}
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// copyRepo copies the files git tracks under root (their working-tree contents) to dst:
// what a fresh clone holds, with the edits not yet committed.
func copyRepo(root, dst string) error {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		return fmt.Errorf("git ls-files: %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, name)
		fi, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			return err
		}
		to := filepath.Join(dst, name)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
			continue
		}
		if !fi.Mode().IsRegular() {
			continue // a submodule
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(to, data, fi.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

// TestDocsNameTests checks that every `go test` command of README.md, RATIONALE.md and the
// docs/*.md pages names tests and benchmarks that exist: for each package it names, each
// alternative of the top level of its -run and -bench patterns must match a function of that
// package (-run '^$' and -run XXX select none on purpose).
func TestDocsNameTests(t *testing.T) {
	root, err := moduleRoot("go")
	if err != nil {
		t.Fatal(err)
	}
	pages, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	checked := 0
	for _, p := range append([]string{filepath.Join(root, "README.md"), filepath.Join(root, "RATIONALE.md")}, pages...) {
		name, _ := filepath.Rel(root, p)
		text, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range goTestCommands(string(text)) {
			for _, pkg := range c.pkgs {
				funcs, err := testFuncs(filepath.Join(root, pkg))
				if err != nil {
					t.Errorf("%s:%d: %s: %v", name, c.line, c.text, err)
					continue
				}
				for flag, prefix := range map[string]string{"-run": "Test|Fuzz|Example", "-bench": "Benchmark"} {
					pat, ok := c.flags[flag]
					if !ok || (flag == "-run" && (pat == "^$" || pat == "XXX")) {
						continue
					}
					for _, alt := range topAlternatives(firstLevel(pat)) {
						re, err := regexp.Compile(alt)
						if err != nil {
							t.Errorf("%s:%d: %s: %s %q: %v", name, c.line, c.text, flag, alt, err)
							continue
						}
						found := false
						for _, f := range funcs {
							if regexp.MustCompile("^("+prefix+")").MatchString(f) && re.MatchString(f) {
								found = true
								break
							}
						}
						if !found {
							t.Errorf("%s:%d: %s: %s %q matches no function of %s", name, c.line, c.text, flag, alt, pkg)
						}
						checked++
					}
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d patterns: the command parser found too few", checked)
	}
}

type goTestCommand struct {
	line  int
	text  string
	pkgs  []string          // directories, relative to the repository root
	flags map[string]string // -run, -bench
}

// goTestCommands returns the `go test` commands of a Markdown text: in inline code (which
// may wrap onto the next line) or on a line of a code block (up to a # comment).
func goTestCommands(text string) []goTestCommand {
	lines := strings.Split(text, "\n")
	var cmds []goTestCommand
	fence := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
			continue
		}
		for off := 0; ; {
			j := strings.Index(l[off:], "go test ")
			if j < 0 {
				break
			}
			j += off
			var cmd string
			if fence {
				cmd = l[j:]
				if k := strings.Index(cmd, " #"); k >= 0 {
					cmd = cmd[:k]
				}
				off = len(l)
			} else {
				if strings.Count(l[:j], "`")%2 == 0 {
					off = j + 1
					continue // prose, not code
				}
				cmd = l[j:]
				for n := i + 1; !strings.Contains(cmd, "`") && n < len(lines) && n <= i+2; n++ {
					cmd += " " + lines[n]
				}
				if k := strings.Index(cmd, "`"); k >= 0 {
					cmd = cmd[:k]
				}
				off = j + 1
			}
			c := goTestCommand{line: i + 1, text: strings.TrimSpace(cmd), flags: map[string]string{}}
			args := shellWords(cmd)
			for k := 2; k < len(args); k++ {
				a := args[k]
				switch {
				case (a == "-run" || a == "-bench") && k+1 < len(args):
					c.flags[a] = args[k+1]
					k++
				case strings.HasPrefix(a, "./") && !strings.Contains(a, "..."):
					c.pkgs = append(c.pkgs, strings.TrimSuffix(a, "/"))
				}
			}
			if len(c.flags) > 0 && len(c.pkgs) > 0 {
				cmds = append(cmds, c)
			}
		}
	}
	return cmds
}

// shellWords splits a command on blanks, honouring single and double quotes.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quote != 0 && ch == quote:
			quote = 0
		case quote != 0:
			w.WriteByte(ch)
		case ch == '\'' || ch == '"':
			quote, in = ch, true
		case ch == ' ' || ch == '\t':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteByte(ch)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// firstLevel returns the part of a -run or -bench pattern that top-level names are
// matched against: up to the first / outside brackets and parentheses (as package testing
// splits it).
func firstLevel(pat string) string {
	return splitTop(pat, '/')[0]
}

// topAlternatives splits a regular expression at the | outside brackets and parentheses.
func topAlternatives(re string) []string {
	return splitTop(re, '|')
}

func splitTop(s string, sep byte) []string {
	var parts []string
	depth, class, start := 0, false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
		case class:
			class = c != ']'
		case c == '[':
			class = true
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == sep && depth == 0:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

// testFuncs returns the names of the Test, Benchmark, Fuzz and Example functions of the
// package in dir.
func testFuncs(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no test files in %s", dir)
	}
	re := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz|Example)\w*)\(`)
	var names []string
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			names = append(names, m[1])
		}
	}
	return names, nil
}

// docPages returns README.md and the docs/*.md pages (in name order) as names relative
// to root with their text: the documents every TestDocs* test holds to the same rules.
func docPages(t *testing.T) (root string, names []string, texts map[string]string) {
	t.Helper()
	root, err := moduleRoot("go")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(pages)
	texts = map[string]string{}
	for _, p := range append([]string{filepath.Join(root, "README.md")}, pages...) {
		name, _ := filepath.Rel(root, p)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
		texts[name] = string(data)
	}
	return root, names, texts
}

// codeLine is a line of code in a Markdown text: a line of a fenced block (up to a " #"
// comment), or the text of an inline code span.
type codeLine struct {
	line int
	text string
}

var inlineCode = regexp.MustCompile("`([^`]+)`")

func codeLines(text string) []codeLine {
	var out []codeLine
	fence := false
	for i, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
			continue
		}
		if fence {
			if strings.HasPrefix(strings.TrimSpace(l), "#") {
				continue
			}
			if k := strings.Index(l, " #"); k >= 0 {
				l = l[:k]
			}
			out = append(out, codeLine{i + 1, l})
			continue
		}
		for _, m := range inlineCode.FindAllStringSubmatch(l, -1) {
			out = append(out, codeLine{i + 1, m[1]})
		}
	}
	return out
}

// headingAnchors returns the anchors GitHub gives a Markdown text's headings (lower case;
// spaces to hyphens; anything but letters, digits, '-' and '_' dropped; "-1", "-2", … for
// repeats), plus the ids of explicit <a id="…"> tags.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		for _, m := range regexp.MustCompile(`<a id="([^"]+)">`).FindAllStringSubmatch(l, -1) {
			anchors[m[1]] = true
		}
		if !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			anchors[slug+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// TestDocsLinks checks that every relative link of README.md and the docs/*.md pages names
// a file of the repository and, with a #fragment into a Markdown file, one of its headings.
func TestDocsLinks(t *testing.T) {
	root, names, texts := docPages(t)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, name := range names {
		for i, l := range strings.Split(texts[name], "\n") {
			for _, m := range link.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, frag, _ := strings.Cut(target, "#")
				path := filepath.Join(root, filepath.Dir(name), file)
				if file == "" {
					path = filepath.Join(root, name)
				}
				rel, _ := filepath.Rel(root, path)
				if strings.HasPrefix(rel, "..") {
					t.Errorf("%s:%d: %s leaves the repository", name, i+1, target)
					continue
				}
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d: %s: no such file (%s)", name, i+1, target, rel)
					continue
				}
				checked++
				if frag == "" || !strings.HasSuffix(path, ".md") {
					continue
				}
				text, ok := texts[rel]
				if !ok {
					data, err := os.ReadFile(path)
					if err != nil {
						t.Errorf("%s:%d: %s: %v", name, i+1, target, err)
						continue
					}
					text = string(data)
				}
				if !headingAnchors(text)[frag] {
					t.Errorf("%s:%d: %s: %s has no heading with the anchor #%s", name, i+1, target, rel, frag)
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d links: the link parser found too few", checked)
	}
}

// TestDocsMakeTargets checks that every `make TARGET` in the code of README.md and the
// docs/*.md pages names a target of the Makefile.
func TestDocsMakeTargets(t *testing.T) {
	root, names, texts := docPages(t)
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9 $()-]*?)\s*:([^=]|$)`).FindAllStringSubmatch(string(mk), -1) {
		for _, w := range strings.Fields(m[1]) {
			targets[w] = true
		}
	}
	use := regexp.MustCompile(`(?:^|[\s;&(])make ([a-z][a-z0-9-]*)`)
	checked := 0
	for _, name := range names {
		for _, c := range codeLines(texts[name]) {
			for _, m := range use.FindAllStringSubmatch(c.text, -1) {
				if !targets[m[1]] {
					t.Errorf("%s:%d: `make %s`: the Makefile has no target %q", name, c.line, m[1], m[1])
				}
				checked++
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d make commands: the parser found too few", checked)
	}
}

// TestDocsSluiceFlags builds cmd/sluice and checks that every `dist/sluice COMMAND` in the
// code of README.md and the docs/*.md pages names a subcommand its --help lists, and that
// every flag given to `sluice COMMAND` (with or without dist/) is one that command's --help
// names.
func TestDocsSluiceFlags(t *testing.T) {
	skipShort(t, "builds cmd/sluice to read its --help")
	root, names, texts := docPages(t)
	bin := filepath.Join(t.TempDir(), "sluice")
	build := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/sluice: %v\n%s", err, out)
	}
	help := func(args ...string) string {
		out, _ := exec.Command(bin, args...).CombinedOutput() // --help may exit 0 or 2
		return string(out)
	}
	subs := map[string]map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z]+)\s{2,}`).FindAllStringSubmatch(help("--help"), -1) {
		flags := map[string]bool{"help": true}
		for _, f := range regexp.MustCompile(`(?:^|[\s\[(])--?([a-z][a-z0-9-]*)`).FindAllStringSubmatch(help(m[1], "--help"), -1) {
			flags[f[1]] = true
		}
		subs[m[1]] = flags
	}
	if len(subs) < 4 {
		t.Fatalf("sluice --help lists %d commands: %v", len(subs), subs)
	}
	cmd := regexp.MustCompile(`(?:^|[\s(])((?:dist/)?sluice) ([a-z-]+)([^|;&]*)`)
	checked := 0
	for _, name := range names {
		for _, c := range codeLines(texts[name]) {
			for _, m := range cmd.FindAllStringSubmatch(c.text, -1) {
				flags, ok := subs[m[2]]
				if strings.HasPrefix(m[3], ":") {
					continue // a message that names the command ("sluice run: unknown flag --x")
				}
				if !ok {
					if m[1] == "dist/sluice" && m[2] != "-" {
						t.Errorf("%s:%d: `%s`: sluice has no command %q", name, c.line, strings.TrimSpace(m[0]), m[2])
					}
					continue
				}
				for _, w := range shellWords(m[3]) {
					f, ok := strings.CutPrefix(w, "-")
					if !ok || f == "" {
						continue
					}
					f = strings.TrimPrefix(f, "-")
					f, _, _ = strings.Cut(f, "=")
					if !regexp.MustCompile(`^[a-z][a-z0-9-]*$`).MatchString(f) {
						continue
					}
					if !flags[f] {
						t.Errorf("%s:%d: `%s`: sluice %s has no flag --%s", name, c.line, strings.TrimSpace(m[0]), m[2], f)
					}
					checked++
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d flags: the command parser found too few", checked)
	}
}

// TestDocsPlain checks that README.md and the docs/*.md pages read as reference: no dated
// runs (those belong in the results file next to the benchmark that printed them), no
// references to the project's issues or to documents outside the repository, and a README
// short enough to read in five minutes.
func TestDocsPlain(t *testing.T) {
	_, names, texts := docPages(t)
	banned := []struct{ re, why string }{
		{`\b20\d\d-\d\d-\d\d\b`, "a date: dated runs go to a results file"},
		{`(?i)\bat load (average )?\d`, "a run's load: dated runs go to a results file"},
		{`(?i)\bwhile other\b`, "a run's circumstances: dated runs go to a results file"},
		{`(?i)\bmeasured here\b`, "a run's circumstances: say which command prints the figure"},
		{`(?i)\bissues? #?\d+`, "a reference to the project's issues"},
		{`DESIGN\.md`, "a document outside the repository"},
		{`(?i)not available here`, "a remark about one machine"},
		// The checked blocks run under pipefail: head exits early and the writer gets SIGPIPE
		// (exit 141) whenever it writes after that — a command that fails now and then.
		{`\| *head\b`, "a pipe into head: it fails under pipefail when the writer outlives it; use sed -n 1p"},
	}
	for _, name := range names {
		for i, l := range strings.Split(texts[name], "\n") {
			for _, b := range banned {
				if m := regexp.MustCompile(b.re).FindString(l); m != "" {
					t.Errorf("%s:%d: %q: %s", name, i+1, m, b.why)
				}
			}
		}
	}
	if n := strings.Count(texts["README.md"], "\n"); n > 320 {
		t.Errorf("README.md has %d lines; the front door should be at most about 300 (move reference to docs/)", n)
	}
}
