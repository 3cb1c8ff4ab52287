package envoy

import (
	"os"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/config"
)

// grpc.json is docs/grpc.md's example, as the page shows it, and a valid
// configuration: one rule on a method, one on a service.
func TestGRPCExample(t *testing.T) {
	data, err := os.ReadFile("grpc.json")
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile("../docs/grpc.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "```json\n"+string(data)+"```\n") {
		t.Error("docs/grpc.md does not show envoy/grpc.json as it is")
	}
	c, err := config.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Rules) != 2 || c.Rules[0].Match.PathPrefix != "/shop.v1.Orders/Create" || c.Rules[1].Match.PathPrefix != "/grpc.health.v1.Health/" ||
		c.Rules[0].Key[0].Header != "x-tenant" || c.Response.GRPCStatus != config.DefaultGRPCStatus {
		t.Errorf("parsed %+v", c)
	}
}
