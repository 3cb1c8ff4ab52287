// Command wasmpatch applies wasmpatch.PollOneoff to a module in place:
//
//	go run ./internal/wasmpatch/cmd/wasmpatch dist/sluice.wasm
package main

import (
	"fmt"
	"os"

	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: wasmpatch MODULE.wasm...")
		os.Exit(2)
	}
	for _, path := range os.Args[1:] {
		if err := wasmpatch.PatchFile(path); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
