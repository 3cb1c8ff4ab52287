package redisclient

import (
	"context"
	"os"
	"testing"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

var cluster *redistest.Cluster

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, 3, &cluster)) }

// aclUser makes an ACL user name, password s3cret, allowed the keys of pattern (e.g.
// "~sluice-auth*"), on every master.
func aclUser(t *testing.T, name, pattern string) {
	t.Helper()
	for i := range cluster.Addrs {
		pc := cluster.Client(i)
		err := pc.Do(context.Background(), "ACL", "SETUSER", name, "on", ">s3cret", pattern, "+@all").Err()
		pc.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}
