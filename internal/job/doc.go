// Package job owns the job file: its schema, defaults and validation.
//
// Load reads a YAML job file strictly (an unknown or mistyped field is an
// error with its line and column), fills every option the file leaves out
// with a default that works, resolves relative paths against the job file's
// directory, and validates the result. Validation reports every problem at
// once, each naming the file, the line and the field, as in
//
//	job.yaml:12: lanes[1].max_tokens: must be > 0
//
// A Spec is plain data after Load: the rest of regen reads it and never
// changes it. Lane assignment (LaneFor), escalation (EscalationLane) and
// the generation parameters sent with every request (Generation.Params) are
// pure functions of the Spec so that every package applies the same rules.
//
// A job names either endpoints (servers someone else runs) or a server that
// regen launches, never both: with a server, the launched server is the only
// endpoint and Endpoints stays empty in the Spec.
//
// The package never opens sources, stores or servers; it only describes them.
package job
