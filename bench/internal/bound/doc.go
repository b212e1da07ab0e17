// Package bound says what bound a measured run: the servers, the process
// that ran regen's runner (and, in the harnesses, the in-process servers and
// clients), or the job's limits. It owns the rule of bench/README.md
// ("Server- or runner-bound"): the samples of the servers' queues and KV
// use, the process's CPU and the simulators' speed, the classification, and
// the wording of its evidence. bench/sweep, bench/slots and go run ./bench
// share it, so a cell means the same thing in each.
//
// It measures and judges; it never prints a table. A caller that compares
// two cells reports a ratio only when Withheld says nothing against it.
package bound
