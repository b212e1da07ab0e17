// Package storetest is the conformance suite every store.Store backend must
// pass. A backend's tests call Run with a function that opens a fresh, empty
// store for each subtest; the suite closes it. RunQueue runs the part a
// store.Queue alone must pass (claims, leases, transitions, the claim
// order; Run runs it too), for fakes that implement only that role, such
// as dispatch's.
//
// The suite uses only the store's interfaces and the wall clock: lease
// expiry is driven through ExpireLeases' now argument and retry times are
// set far in the past or future, so no backend needs a fake clock to pass.
// It covers every transition of the sample state machine, the rule that a
// transition needs the caller's live lease (store.ErrNotLeased otherwise,
// and nothing changes), which transitions spend an attempt (Complete,
// Reject, Retry and DeadLetter spend one each; Release, ReleaseOwner,
// Escalate and ExpireLeases never do), and concurrent claimers that must
// never hold the same sample at once. The capture cases (capture.go) hold
// the hidden-state capture table to the same rules: a key is claimed under
// a fenced lease, recorded once with a path no other key lists, and only
// FailCapture spends an attempt.
package storetest
