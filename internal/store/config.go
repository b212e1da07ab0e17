package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Config is a job's configuration as the store keeps it: the canonical
// form of everything that can change an answer and its fingerprint (both
// computed by job.Spec.Fingerprint; the store only compares and keeps them).
type Config struct {
	Fingerprint string
	Canonical   []byte
}

// Generation is one configuration a job's answers were generated with.
// The first run of a job starts generation 1; `regen run --new-config`
// starts the next one. The current generation is the last. Status, stats
// and the manifest show it in JSON as tagged.
type Generation struct {
	N           int             `json:"generation"`
	Fingerprint string          `json:"fingerprint"`
	Config      json.RawMessage `json:"config"` // the canonical configuration
	// ServedModel is the model id the servers answered with, recorded once
	// known; "" until then.
	ServedModel string    `json:"served_model,omitempty"`
	Started     time.Time `json:"started"`
	// Requeued is how many samples this generation's start sent back to a
	// fresh start (pending at turn 0, no attempts spent, no retry time):
	// every sample not there already.
	Requeued int `json:"requeued"`
	// Superseded is how many of this generation's answers were moved to
	// the history when a later generation started.
	Superseded int `json:"superseded"`
	// Answers is how many stored answers the dataset holds now (every
	// answer of the current generation, earlier turns included; 0 for
	// older generations, whose answers are in the history).
	Answers int `json:"answers"`
}

// ErrConfigChanged is what Configure's *ConfigChangedError matches.
var ErrConfigChanged = errors.New("job configuration changed")

// ConfigChangedError is returned by Configure when the job's configuration
// is not the one the store's answers were generated with.
type ConfigChangedError struct {
	Current Generation // the store's current generation
	Want    Config     // the job's configuration
}

func (e *ConfigChangedError) Error() string {
	return fmt.Sprintf("job configuration changed: the store's answers were generated with configuration generation %d (fingerprint %.12s), the job file's fingerprint is %.12s",
		e.Current.N, e.Current.Fingerprint, e.Want.Fingerprint)
}

func (e *ConfigChangedError) Is(target error) bool { return target == ErrConfigChanged }

// LaneRange assigns the pending samples of Partition whose estimated
// prompt tokens are in [MinTokens, MaxTokens] (MaxTokens 0 = no upper
// bound) to Lane.
type LaneRange struct {
	Partition            string
	MinTokens, MaxTokens int
	Lane                 string
}

// ConfigureOptions tune Configure.
type ConfigureOptions struct {
	// NewGeneration accepts a configuration other than the current one: it
	// starts the next generation, returns every sample to pending at its
	// first turn with no attempts spent (their answers and dead-letter
	// reasons move to the history, nothing is deleted) and puts them in
	// the lanes Lanes gives. With the same configuration it does nothing.
	NewGeneration bool
	Lanes         []LaneRange
	// Rebuild lists the partitions whose request bodies the new generation
	// changes (a source's mapping, system prompt, tools...): their samples
	// are held back from claims, and their manifest entries, bad rows and
	// duplicate records dropped, so ingest reads their files again and
	// rebuilds each body (Intake.Ingest) before it is sent; DropStale then
	// removes the samples no row rebuilt (an id-less row's id is a hash of
	// its content, so a changed body has a new id).
	Rebuild []string
	// Legacy is the fingerprint an earlier regen computed for the same
	// configuration: a current generation with it takes c's fingerprint
	// and canonical form in place, as the same generation.
	Legacy string
	// Now stamps a new generation; zero means the store's clock.
	Now time.Time
}

// Configs is the store's record of the configurations a job ran with.
// Every backend implements it; storetest checks it.
type Configs interface {
	// Configure checks the job's configuration against the current
	// generation, atomically with any other worker doing the same: with
	// no generation yet (a new store, or one written before regen kept
	// configurations) c becomes generation 1; with the same fingerprint
	// it returns the current generation; with another one it returns a
	// *ConfigChangedError unless o.NewGeneration.
	Configure(ctx context.Context, c Config, o ConfigureOptions) (Generation, error)
	// Generations returns every generation, oldest first (none before the
	// first Configure). The last one is current.
	Generations(ctx context.Context) ([]Generation, error)
	// SetServedModel records the model id generation gen's servers answer
	// with, unless one is recorded already, and returns the recorded one.
	SetServedModel(ctx context.Context, gen int, model string) (string, error)
}

// NextGeneration is Configure's decision, shared by every backend: given
// the current generation (ok=false: none yet) it returns the generation
// Configure answers with, and whether it is a new one to record
// (requeue: after returning every sample to a fresh start); a record
// without requeue of the current generation's number replaces that
// generation's fingerprint (o.Legacy). Only the I/O around it differs
// between backends.
func NextGeneration(cur Generation, ok bool, c Config, o ConfigureOptions, now time.Time) (g Generation, record, requeue bool, err error) {
	switch {
	case !ok:
		return Generation{N: 1, Fingerprint: c.Fingerprint, Config: c.Canonical, Started: now}, true, false, nil
	case cur.Fingerprint == c.Fingerprint:
		return cur, false, false, nil
	case o.Legacy != "" && cur.Fingerprint == o.Legacy:
		cur.Fingerprint, cur.Config = c.Fingerprint, c.Canonical
		return cur, true, false, nil
	case !o.NewGeneration:
		return Generation{}, false, false, &ConfigChangedError{Current: cur, Want: c}
	}
	return Generation{N: cur.N + 1, Fingerprint: c.Fingerprint, Config: c.Canonical, Started: now}, true, true, nil
}

// Current returns the last of gens, ok=false when there is none.
func Current(gens []Generation) (Generation, bool) {
	if len(gens) == 0 {
		return Generation{}, false
	}
	return gens[len(gens)-1], true
}

// Provenance is where a stored answer came from. Dispatch keeps it in the
// answer's record (package reply) under "provenance"; export and the views
// read it back with the record.
type Provenance struct {
	// Generation is the configuration generation the answer was
	// generated with (also the answer's generation column).
	Generation int `json:"generation"`
	// Model is the model id the response named; SystemFingerprint the
	// response's system_fingerprint, when the server sent one.
	Model             string `json:"model,omitempty"`
	SystemFingerprint string `json:"system_fingerprint,omitempty"`
	// Engine and EngineVersion are the server's kind and version as it
	// reports them (SGLang /get_server_info, vLLM /version, llama-server
	// /props build_info); "" when it did not say.
	Engine        string `json:"engine,omitempty"`
	EngineVersion string `json:"engine_version,omitempty"`
	// Sampling is the sampling parameters the request sent (the job's
	// generation settings and the lane's max_tokens), a JSON object.
	Sampling json.RawMessage `json:"sampling,omitempty"`
	// Seed is the request's seed, when one was sent.
	Seed *int64 `json:"seed,omitempty"`
}
