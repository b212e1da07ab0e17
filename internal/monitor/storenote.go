package monitor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// StoreNote is what a runner that cannot write its store says about itself
// in a file beside the job (its state directory), where status reads it
// without the store: a live runner whose heartbeat cannot be written is
// DOWN with the store as the cause, not DEAD.
type StoreNote struct {
	Owner string    `json:"owner"`
	PID   int       `json:"pid"`
	Host  string    `json:"host"`
	Time  time.Time `json:"time"`  // refreshed at every heartbeat the store refused
	Since time.Time `json:"since"` // start of the outage
	Cause string    `json:"cause"`
}

// storeNotePattern names one note per runner process in a state directory.
const storeNotePattern = "store-down.%d.json"

// WriteStoreNote writes n into dir (atomically: status may read it at once).
func WriteStoreNote(dir string, n StoreNote) error {
	b, err := json.Marshal(n)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, fmt.Sprintf(storeNotePattern, n.PID))
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write store note: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write store note: %w", err)
	}
	return nil
}

// RemoveStoreNote removes the note of process pid from dir, if any.
func RemoveStoreNote(dir string, pid int) error {
	err := os.Remove(filepath.Join(dir, fmt.Sprintf(storeNotePattern, pid)))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove store note: %w", err)
	}
	return nil
}

// ReadStoreNotes reads every runner's note in dir; unreadable ones are
// skipped (a note is a hint, the store stays the truth).
func ReadStoreNotes(dir string) []StoreNote {
	paths, _ := filepath.Glob(filepath.Join(dir, "store-down.*.json"))
	var out []StoreNote
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var n StoreNote
		if json.Unmarshal(b, &n) == nil && n.Owner != "" {
			out = append(out, n)
		}
	}
	return out
}

// storeNoteOf returns the current note of the worker of heartbeat owner:
// written after its heartbeat, within dead_after of now, by a process that
// still exists when it is on this host.
func storeNoteOf(owner string, hbTime time.Time, o AssessOptions) (StoreNote, bool) {
	for _, n := range o.StoreNotes {
		if n.Owner != owner || !n.Time.After(hbTime) || o.Now.Sub(n.Time) > o.DeadAfter {
			continue
		}
		if o.Host != "" && n.Host == o.Host && !ProcessAlive(n.PID) {
			continue
		}
		return n, true
	}
	return StoreNote{}, false
}

// storeDownEvidence says why a live runner's heartbeat is old.
func storeDownEvidence(n StoreNote, hbAge time.Duration, now time.Time) []string {
	return []string{
		fmt.Sprintf("store cannot be written for %s: %s", now.Sub(n.Since).Round(time.Second), n.Cause),
		fmt.Sprintf("runner pid %d on %s is alive (its note %s ago); its heartbeat in the store is %s old because it cannot be written; it resumes by itself when the store is back",
			n.PID, n.Host, now.Sub(n.Time).Round(time.Second), hbAge.Round(time.Second)),
	}
}
