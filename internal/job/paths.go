package job

import (
	"fmt"
	"path/filepath"
	"strings"
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

// Rel is p as regen shows and records it: relative to the job file's
// directory when p lies inside it, p itself otherwise (an absolute path
// outside the job's folder, a DSN, a relative path). A "path:line" origin
// works too. Every message and data file uses this one rule, so paths read
// the same in `run`, `status`, `export`, dead letters and the dashboard.
func (s *Spec) Rel(p string) string { return RelTo(s.Dir, p) }

// RelText is Rel for the paths inside a message (an error from a library
// that names files absolute): the job's folder is taken off each.
func (s *Spec) RelText(text string) string {
	if s.Dir == "" {
		return text
	}
	return strings.ReplaceAll(text, s.Dir+string(filepath.Separator), "")
}

// RelTo is Rel for a job folder dir; origins stored absolute by older
// versions display relative through it too.
func RelTo(dir, p string) string {
	if dir == "" || !filepath.IsAbs(p) {
		return p
	}
	r, err := filepath.Rel(dir, p)
	if err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
		return p
	}
	return r
}

// FromRel is a path recorded by RelTo (slashes allowed) made absolute and
// clean again: joined under the job folder dir unless already absolute.
func FromRel(dir, p string) string {
	p = filepath.FromSlash(p)
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return filepath.Clean(p)
}
