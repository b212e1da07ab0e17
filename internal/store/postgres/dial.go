package postgres

import (
	"net"
	"time"
)

// deadRoute bounds how long a connection whose route to the database is
// cut (packets vanish: no reset, no error) can hold a call: sent data
// unacknowledged for this long, or an idle connection whose keep-alive
// probes go unanswered, ends the connection with an error. The call then
// fails, the worker says the store is DOWN and retries on a new
// connection, instead of waiting for the kernel's retransmissions (about
// 15 minutes) with its heartbeat silent.
const deadRoute = 10 * time.Second

// dialer connects with keep-alive probes and, where the platform has it, a
// TCP user timeout of deadRoute.
func dialer(connectTimeout time.Duration) *net.Dialer {
	return &net.Dialer{
		Timeout: connectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: deadRoute / 2, Interval: time.Second,
			Count: int(deadRoute / 2 / time.Second)},
		Control: userTimeout(deadRoute),
	}
}
