package redisclient

import (
	"os"
	"testing"

	"github.com/sluice-proxy/sluice/internal/rediscluster"
)

var cluster *rediscluster.Cluster

func TestMain(m *testing.M) { os.Exit(rediscluster.Main(m, 3, &cluster)) }
