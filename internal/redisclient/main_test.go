package redisclient

import (
	"os"
	"testing"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

var cluster *redistest.Cluster

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, 3, &cluster)) }
