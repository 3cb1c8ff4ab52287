package redisclient

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redistest"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// cmd encodes a command as the guest sends it: a RESP array of bulk strings.
func cmd(args ...string) []byte {
	b := resp.AppendArrayHeader(nil, len(args))
	for _, a := range args {
		b = resp.AppendBulkString(b, a)
	}
	return b
}

func newClusters(t *testing.T, timeout time.Duration) *Clusters {
	redistest.SkipShort(t)
	t.Helper()
	c := New(map[string][]string{"rc": cluster.Addrs}, Options{})
	if err := c.Init("rc", "", "", timeout); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func do(t *testing.T, c *Clusters, args ...string) (Status, string) {
	t.Helper()
	st, reply, err := c.Do(context.Background(), "rc", cmd(args...))
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return st, string(reply)
}

func TestSyncErrors(t *testing.T) {
	redistest.SkipShort(t)
	c := New(map[string][]string{"rc": cluster.Addrs}, Options{})
	defer c.Close()
	if err := c.Init("nope", "", "", time.Second); !errors.Is(err, ErrUnknownCluster) {
		t.Fatalf("Init unknown: %v", err)
	}
	if err := c.Call(context.Background(), "rc", cmd("PING"), func(Status, []byte) { t.Error("callback") }); !errors.Is(err, ErrNotInitialized) {
		t.Fatalf("Call before Init: %v", err)
	}
	if err := c.Call(context.Background(), "nope", cmd("PING"), nil); !errors.Is(err, ErrUnknownCluster) {
		t.Fatalf("Call unknown: %v", err)
	}
	if err := c.Init("rc", "", "", 0); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "*1\r\n$3\r\nGET", ":1\r\n", "*0\r\n", "*1\r\n:1\r\n", "*1\r\n$-1\r\n", "*1\r\n$4\r\nPING\r\nextra"} {
		if err := c.Call(context.Background(), "rc", []byte(bad), nil); !errors.Is(err, ErrBadCommand) {
			t.Errorf("Call(%q): %v", bad, err)
		}
	}
}

func TestParseFlag(t *testing.T) {
	name, addrs, err := ParseFlag("rc=127.0.0.1:7000,[::1]:7001")
	if err != nil || name != "rc" || len(addrs) != 2 || addrs[1] != "[::1]:7001" {
		t.Fatalf("got %q %q %v", name, addrs, err)
	}
	for _, bad := range []string{"", "rc", "=a:1", "rc=", "rc=localhost", "rc=a:1,,b:2"} {
		if _, _, err := ParseFlag(bad); err == nil {
			t.Errorf("ParseFlag(%q) accepted", bad)
		}
	}
}

// Keys spread over every node are routed to their slot's owner, and the
// replies come back as RESP2 bytes of every type.
func TestRoutingAndReplyTypes(t *testing.T) {
	redistest.SkipShort(t)
	c := newClusters(t, time.Second)
	perNode := make([]int, len(cluster.Addrs))
	for i := 0; i < 60; i++ {
		k := "route-" + strconv.Itoa(i)
		if st, r := do(t, c, "SET", k, "v"+strconv.Itoa(i)); st != StatusOK || r != "$2\r\nOK\r\n" {
			t.Fatalf("SET %s: %v %q", k, st, r)
		}
		if st, r := do(t, c, "GET", k); st != StatusOK || r != string(resp.AppendBulkString(nil, "v"+strconv.Itoa(i))) {
			t.Fatalf("GET %s: %v %q", k, st, r)
		}
		n, err := cluster.NodeOf(k)
		if err != nil {
			t.Fatal(err)
		}
		// The owner, asked directly, holds the key.
		pc := cluster.Client(n)
		v, err := pc.Get(context.Background(), k).Result()
		pc.Close()
		if err != nil || v != "v"+strconv.Itoa(i) {
			t.Fatalf("owner of %s: %q %v", k, v, err)
		}
		perNode[n]++
	}
	for i, n := range perNode {
		if n == 0 {
			t.Errorf("no key landed on node %d: %v", i, perNode)
		}
	}
	cases := []struct{ args []string }{
		{[]string{"GET", "missing-key"}},
		{[]string{"INCRBY", "counter-key", "5"}},
		{[]string{"EVAL", "return {1, 'two', {3, false}, redis.error_reply('WRONG inner')}", "1", "k"}},
		{[]string{"EVALSHA", "0000000000000000000000000000000000000000", "1", "k"}},
		{[]string{"LPUSH", "route-1", "x"}},
	}
	want := []string{
		"$-1\r\n",
		":5\r\n",
		"*4\r\n:1\r\n$3\r\ntwo\r\n*2\r\n:3\r\n$-1\r\n-WRONG inner\r\n",
		"-NOSCRIPT No matching script. Please use EVAL.\r\n",
		"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
	}
	for i, tc := range cases {
		st, r := do(t, c, tc.args...)
		if st != StatusOK || r != want[i] {
			t.Errorf("%v: %v %q, want %q", tc.args, st, r, want[i])
		}
		if _, err := resp.Parse([]byte(r)); err != nil {
			t.Errorf("%v: reply does not parse: %v", tc.args, err)
		}
	}
}

// With a current slot map every command, scripts included (their key is
// the first after numkeys), goes straight to its slot's owner: no node
// answers MOVED.
func TestNoRedirectsWhenRoutedByKey(t *testing.T) {
	redistest.SkipShort(t)
	c := newClusters(t, time.Second)
	ctx := context.Background()
	do(t, c, "PING") // loads the slot map
	for i := range cluster.Addrs {
		pc := cluster.Client(i)
		if err := pc.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		pc.Close()
	}
	for i := 0; i < 60; i++ {
		k := "direct-" + strconv.Itoa(i)
		if st, r := do(t, c, "EVAL", "return redis.call('INCR', KEYS[1])", "1", k); st != StatusOK || r != ":1\r\n" {
			t.Fatalf("EVAL on %s: %v %q", k, st, r)
		}
		if st, r := do(t, c, "GET", k); st != StatusOK || r != "$1\r\n1\r\n" {
			t.Fatalf("GET %s: %v %q", k, st, r)
		}
	}
	for i := range cluster.Addrs {
		pc := cluster.Client(i)
		info, err := pc.Info(ctx, "errorstats").Result()
		pc.Close()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info, "errorstat_MOVED") || strings.Contains(info, "errorstat_ASK") {
			t.Fatalf("node %d answered redirects:\n%s", i, info)
		}
	}
}

// A slot moved behind the client's back answers MOVED; the client follows
// it and refreshes its slot map.
func TestMovedIsFollowed(t *testing.T) {
	redistest.SkipShort(t)
	c := newClusters(t, time.Second)
	ctx := context.Background()
	const key = "moved-test-key"
	if st, _ := do(t, c, "DEL", key); st != StatusOK { // loads the slot map
		t.Fatal(st)
	}
	from, err := cluster.NodeOf(key)
	if err != nil {
		t.Fatal(err)
	}
	to := (from + 1) % len(cluster.Addrs)
	slot := redistest.Slot(key)
	id := func(i int) string {
		pc := cluster.Client(i)
		defer pc.Close()
		s, err := pc.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	move := func(target int) {
		tid := id(target)
		for i := range cluster.Addrs {
			pc := cluster.Client(i)
			if err := pc.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", tid).Err(); err != nil {
				t.Fatalf("SETSLOT on %d: %v", i, err)
			}
			pc.Close()
		}
	}
	move(to)
	t.Cleanup(func() { move(from) })
	old := cluster.Client(from)
	defer old.Close()
	if err := old.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if st, r := do(t, c, "SET", key, "x"); st != StatusOK || r != "$2\r\nOK\r\n" {
		t.Fatalf("SET after move: %v %q", st, r)
	}
	// The client did go to the old owner and was redirected.
	if info, _ := old.Info(ctx, "errorstats").Result(); !strings.Contains(info, "errorstat_MOVED:count=1") {
		t.Fatalf("old owner did not answer MOVED:\n%s", info)
	}
	pc := cluster.Client(to)
	defer pc.Close()
	if v, err := pc.Get(ctx, key).Result(); err != nil || v != "x" {
		t.Fatalf("new owner: %q %v", v, err)
	}
	if st, r := do(t, c, "DEL", key); st != StatusOK || r != ":1\r\n" {
		t.Fatalf("DEL: %v %q", st, r)
	}
}

func TestAsyncCallsConcurrently(t *testing.T) {
	c := newClusters(t, 2*time.Second)
	const n = 1000
	var wg sync.WaitGroup
	var calls, bad atomic.Int64
	wg.Add(n)
	for i := 0; i < n; i++ {
		err := c.Call(context.Background(), "rc", cmd("INCR", "async-counter"), func(st Status, r []byte) {
			calls.Add(1)
			if st != StatusOK || r[0] != ':' {
				bad.Add(1)
			}
			wg.Done()
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if calls.Load() != n || bad.Load() != 0 {
		t.Fatalf("calls %d bad %d", calls.Load(), bad.Load())
	}
	if st, r := do(t, c, "GET", "async-counter"); st != StatusOK || r != "$4\r\n1000\r\n" {
		t.Fatalf("counter: %v %q", st, r)
	}
}

// A node that stops answering yields StatusTimeout within the Init timeout;
// a dead node yields an error status quickly; both recover.
func TestTimeoutAndNodeFailure(t *testing.T) {
	redistest.SkipShort(t)
	const timeout = 150 * time.Millisecond
	c := newClusters(t, timeout)
	const key = "failing-node-key"
	if st, _ := do(t, c, "SET", key, "1"); st != StatusOK {
		t.Fatal(st)
	}
	n, err := cluster.NodeOf(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Pause(n); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		start := time.Now()
		var got Status
		var reply []byte
		done := make(chan struct{})
		if err := c.Call(context.Background(), "rc", cmd("GET", key), func(st Status, r []byte) { got, reply = st, r; close(done) }); err != nil {
			t.Fatal(err)
		}
		<-done
		el := time.Since(start)
		if got != StatusTimeout || reply != nil || el < timeout {
			t.Fatalf("paused node: %v %q after %v", got, reply, el)
		}
	}
	// Other nodes keep serving.
	other := ""
	for i := 0; other == ""; i++ {
		k := "other-" + strconv.Itoa(i)
		if j, _ := cluster.NodeOf(k); j != n {
			other = k
		}
	}
	if st, _ := do(t, c, "SET", other, "1"); st != StatusOK {
		t.Fatalf("healthy node while another is paused: %v", st)
	}
	if err := cluster.Resume(n); err != nil {
		t.Fatal(err)
	}
	waitOK(t, c, key)

	if err := cluster.Kill(n); err != nil {
		t.Fatal(err)
	}
	st, r := do(t, c, "GET", key)
	if st == StatusOK || r != "" {
		t.Fatalf("dead node: %v %q", st, r)
	}
	if err := cluster.Restart(n); err != nil {
		t.Fatal(err)
	}
	waitOK(t, c, key)
}

func waitOK(t *testing.T, c *Clusters, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, r := do(t, c, "GET", key)
		if st == StatusOK && (r == "$1\r\n1\r\n" || r == "$-1\r\n") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery: %v %q", st, r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Init's username and password authenticate every connection (ACL user).
func TestAuth(t *testing.T) {
	redistest.SkipShort(t)
	ctx := context.Background()
	aclUser(t, "sluice", "~sluice-auth*")
	c := New(map[string][]string{"rc": cluster.Addrs}, Options{})
	defer c.Close()
	if err := c.Init("rc", "sluice", "s3cret", time.Second); err != nil {
		t.Fatal(err)
	}
	if st, r, _ := c.Do(ctx, "rc", cmd("SET", "sluice-auth-k", "1")); st != StatusOK || string(r) != "$2\r\nOK\r\n" {
		t.Fatalf("authorised SET: %v %q", st, r)
	}
	// The ACL confines the user to its keys: the connection really is
	// authenticated as "sluice", not as the default user.
	if st, r, _ := c.Do(ctx, "rc", cmd("SET", "other-k", "1")); st != StatusOK || !strings.HasPrefix(string(r), "-NOPERM") {
		t.Fatalf("forbidden SET: %v %q", st, r)
	}
	bad := New(map[string][]string{"rc": cluster.Addrs}, Options{})
	defer bad.Close()
	if err := bad.Init("rc", "sluice", "wrong", time.Second); err != nil {
		t.Fatal(err)
	}
	st, r, _ := bad.Do(ctx, "rc", cmd("GET", "sluice-auth-k"))
	t.Logf("wrong password: %v %q", st, r)
	if st == StatusOK && !strings.HasPrefix(string(r), "-WRONGPASS") {
		t.Fatalf("wrong password: %v %q", st, r)
	}
}

func TestAppendReply(t *testing.T) {
	got := AppendReply(nil, []any{int64(-1), "a", []byte("b"), nil, []any{}, errors.New("ERR x\r\ny"), true, false, 1.5, struct{}{}})
	want := "*10\r\n:-1\r\n$1\r\na\r\n$1\r\nb\r\n$-1\r\n*0\r\n-ERR x  y\r\n:1\r\n:0\r\n$3\r\n1.5\r\n-ERR redisclient: reply of unsupported type\r\n"
	if string(got) != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}
