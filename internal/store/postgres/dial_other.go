//go:build !linux

package postgres

import (
	"syscall"
	"time"
)

// userTimeout is Linux only; elsewhere keep-alive probes alone notice a
// cut route, and only on idle connections.
func userTimeout(time.Duration) func(network, address string, c syscall.RawConn) error { return nil }
