package sim

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

func TestReadCSVOffsets(t *testing.T) {
	in := `# a comment
timestamp,key,cost
0,alice
0.5, bob ,2

250ms,alice,1
1m30s,"carol,with comma",3
90.000000001,alice,
`
	tr, err := ReadCSV(strings.NewReader(in), "t.csv")
	if err == nil {
		t.Fatalf("250ms after 0.5s should be out of order; got %d requests", len(tr.Requests))
	}
	in = strings.Replace(in, "250ms,alice,1\n", "", 1)
	tr, err = ReadCSV(strings.NewReader(in), "t.csv")
	if err != nil {
		t.Fatal(err)
	}
	e := Epoch.UnixNano()
	want := []Request{
		{At: e, Key: 0, Cost: 1},
		{At: e + 5e8, Key: 1, Cost: 2},
		{At: e + 90e9, Key: 2, Cost: 3},
		{At: e + 90e9 + 1, Key: 0, Cost: 1},
	}
	if len(tr.Requests) != len(want) {
		t.Fatalf("requests = %v", tr.Requests)
	}
	for i := range want {
		if tr.Requests[i] != want[i] {
			t.Errorf("request %d = %+v, want %+v", i, tr.Requests[i], want[i])
		}
	}
	if strings.Join(tr.Keys, "|") != "alice|bob|carol,with comma" {
		t.Errorf("keys = %q", tr.Keys)
	}
	if tr.Start != e || tr.End != e+90e9+2 {
		t.Errorf("span [%d, %d)", tr.Start-e, tr.End-e)
	}
}

func TestReadCSVAbsolute(t *testing.T) {
	in := "2026-03-01T10:00:00.750Z,a\n2026-03-01T11:00:00.75+01:00,b\n2026-03-01T10:00:01Z,a\n"
	tr, err := ReadCSV(strings.NewReader(in), "abs.csv")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC).UnixNano()
	if tr.Start != t0 {
		t.Errorf("start = %v, want the first timestamp rounded down to a second", time.Unix(0, tr.Start).UTC())
	}
	if tr.Requests[0].At != t0+75e7 || tr.Requests[1].At != t0+75e7 || tr.Requests[2].At != t0+1e9 {
		t.Errorf("times = %+v", tr.Requests)
	}
}

// The token budget's columns: actual (empty: no usage) and duration.
func TestReadCSVUsage(t *testing.T) {
	in := "timestamp,key,cost,actual,duration\n0,a\n0.5,a,10,4,1.5\n1,b,3,,250ms\n2,a,2,0\n"
	tr, err := ReadCSV(strings.NewReader(in), "u.csv")
	if err != nil {
		t.Fatal(err)
	}
	want := []Usage{{Actual: NoUsage}, {Actual: 4, In: 15e8}, {Actual: NoUsage, In: 25e7}, {Actual: 0}}
	if fmt.Sprint(tr.Usage) != fmt.Sprint(want) || tr.Requests[1].Cost != 10 || tr.Requests[2].Cost != 3 {
		t.Errorf("usage %v, want %v; requests %v", tr.Usage, want, tr.Requests)
	}
	// Without those columns, no usage at all.
	tr, err = ReadCSV(strings.NewReader("0,a,2\n1,a,,\n"), "plain.csv")
	if err != nil || tr.Usage != nil || tr.usage(1) != (Usage{Actual: NoUsage}) {
		t.Errorf("plain file: usage %v, %v", tr.Usage, err)
	}
}

func TestReadCSVErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", "bad traffic file: x.csv: no requests"},
		{"only comments", "# nothing\n\n", "x.csv: no requests"},
		{"only header", "timestamp,key,cost\n", "x.csv: no requests"},
		{"one field", "0,a\n1\n", "x.csv:2: 1 fields, want timestamp,key[,cost[,actual[,duration]]]"},
		{"six fields", "0,a,1,2,1s,x\n", "x.csv:1: 6 fields"},
		{"negative actual", "0,a,1,-1\n", `x.csv:1: actual "-1" must be an integer from 0 to`},
		{"fraction actual", "0,a,1,2.5\n", `actual "2.5" must be`},
		{"huge actual", "0,a,1,999999999999999999\n", `actual "999999999999999999" must be`},
		{"negative duration column", "0,a,1,2,-1s\n", `duration "-1s" must be seconds`},
		{"absolute duration", "0,a,1,2,2026-01-01T00:00:00Z\n", `duration "2026-01-01T00:00:00Z" must be`},
		{"bad duration", "0,a,1,2,later\n", `x.csv:1: duration "later"`},
		{"bad time", "0,a\nsoon,a\n", `x.csv:2: timestamp "soon": not an RFC 3339 time, a number of seconds or a duration`},
		{"bad rfc3339", "2026-13-01T00:00:00Z,a\n", `x.csv:1: timestamp "2026-13-01T00:00:00Z": not an RFC 3339 time`},
		{"negative offset", "-1,a\n", `x.csv:1: timestamp "-1": negative offset`},
		{"negative duration", "-5s,a\n", `negative offset`},
		{"nan", "NaN,a\n", `offset out of range`},
		{"huge", "1e300,a\n", `offset out of range`},
		{"unsorted", "0,a\n5,a\n4.5,b\n", `x.csv:3: timestamp "4.5" is earlier than the previous line's "5"; sort the file by time`},
		{"mixed", "0,a\n2026-01-01T00:00:00Z,a\n", "x.csv:2: timestamp \"2026-01-01T00:00:00Z\" mixes absolute times and offsets"},
		{"empty key", "0, \n", "x.csv:1: empty key"},
		{"zero cost", "0,a,0\n", `x.csv:1: cost "0" must be an integer >= 1`},
		{"negative cost", "0,a\n1,a,-2\n", `x.csv:2: cost "-2" must be an integer >= 1`},
		{"fraction cost", "0,a,1.5\n", `cost "1.5" must be`},
		{"quote", "0,\"a\n", "x.csv:1:"},
		{"header later", "0,a\ntimestamp,key\n", "x.csv:2: timestamp \"timestamp\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadCSV(strings.NewReader(tc.in), "x.csv")
			if err == nil {
				t.Fatalf("accepted; want error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %q, want it to contain %q", err, tc.want)
			}
			if !errors.Is(err, ErrCSV) {
				t.Errorf("err does not wrap ErrCSV: %v", err)
			}
		})
	}
}

func FuzzReadCSV(f *testing.F) {
	f.Add("0,a\n1.5,b,2\n")
	f.Add("2026-01-01T00:00:00Z,a\n")
	f.Add("timestamp,key\n1m,\"x,y\",3\n")
	f.Fuzz(func(t *testing.T, in string) {
		tr, err := ReadCSV(strings.NewReader(in), "f.csv")
		if err != nil {
			return
		}
		// Whatever is accepted is a valid traffic the engine can run.
		if len(tr.Requests) == 0 || tr.End <= tr.Start {
			t.Fatalf("accepted an empty traffic: %+v", tr)
		}
		for i, r := range tr.Requests {
			if r.At < tr.Start || r.At >= tr.End || r.Cost < 1 || int(r.Key) >= len(tr.Keys) {
				t.Fatalf("request %d invalid: %+v", i, r)
			}
			if i > 0 && r.At < tr.Requests[i-1].At {
				t.Fatal("not sorted")
			}
		}
	})
}

func TestReadCSVExampleFile(t *testing.T) {
	f, err := os.Open("testdata/example.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := ReadCSV(f, "testdata/example.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Requests) != 8 || len(tr.Keys) != 2 {
		t.Fatalf("%d requests, %d keys", len(tr.Requests), len(tr.Keys))
	}
	lim, err := algorithms.New(algorithms.FixedWindow, algorithms.Params{Limit: 5, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(tr, "example", lim, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// alice: 1+1+3 = 5 units in the first minute, so 59.9 is denied; 60 and
	// 60.1 open a new window. bob: 1 and 2. Over (0.1s, 1m0.1s] alice has
	// 1+3+1+1 = 6 admitted units: the most in any minute.
	if r.Admitted != 7 || r.Denied != 1 || r.MaxInWindow != 6 || r.MaxInWindowKey != "alice" {
		t.Fatalf("admitted %d denied %d max %d (%s)", r.Admitted, r.Denied, r.MaxInWindow, r.MaxInWindowKey)
	}
}
