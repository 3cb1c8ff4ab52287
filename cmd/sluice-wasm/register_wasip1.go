//go:build wasip1

package main

import (
	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
)

func init() { abi.SetHandler(filter.NewVM(new(abi.Imports))) }
