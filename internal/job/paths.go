package job

import (
	"fmt"
	"path/filepath"
)

// StateDir is where a run keeps its files beside the job file: regen's own
// log (regen.log) and the logs of the servers it launches.
func (s *Spec) StateDir() string { return filepath.Join(s.Dir, ".regen", s.BaseName()) }

// LogPath is regen's log file for this job; the terminal shows only the
// progress view and state changes.
func (s *Spec) LogPath() string { return filepath.Join(s.StateDir(), "regen.log") }

// FieldErrorf returns a problem with the field at path, at its line in the
// job file, for checks made outside this package (validate's look at the
// source files).
func (s *Spec) FieldErrorf(path, format string, args ...any) *FieldError {
	return &FieldError{File: s.Path, Line: s.loc.line(path), Field: path, Msg: fmt.Sprintf(format, args...)}
}
