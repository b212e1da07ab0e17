package runner

import (
	"context"
	"fmt"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/source"
	"github.com/regen-dev/regen/internal/store"
)

// IngestStats counts what one ingest pass did.
type IngestStats struct {
	Read     int // rows read, good and bad
	Inserted int // new samples (the other good rows were already stored)
	Bad      int // rows dead-lettered at ingest
	// Duplicates are rows skipped because another row already took their
	// id, over every ingest of the job so far.
	Duplicates int
}

// Samples is the number of good rows that are samples: new or already
// stored (rows skipped for a taken id are not).
func (s IngestStats) Samples() int { return s.Read - s.Bad - s.Duplicates }

// String is the ingest summary the run prints and records.
func (s IngestStats) String() string {
	out := fmt.Sprintf("%d rows read: %d new samples, %d already stored, %d bad rows (dead letters)",
		s.Read, s.Inserted, max(s.Samples()-s.Inserted, 0), s.Bad)
	if s.Duplicates > 0 {
		out += fmt.Sprintf(", %d rows skipped because another row has their id (see regen stats)", s.Duplicates)
	}
	return out
}

const ingestBatch = 1000

// Ingest reads every source and stores new samples and bad rows. It is
// idempotent: samples already stored are skipped by id, bad rows by origin.
func Ingest(ctx context.Context, spec *job.Spec, st store.Store) (IngestStats, error) {
	var stats IngestStats
	batch := make([]store.NewSample, 0, ingestBatch)
	var bad []store.IngestError
	flush := func() error {
		if len(batch) > 0 {
			n, err := st.Ingest(ctx, batch)
			if err != nil {
				return err
			}
			stats.Inserted += n
			batch = batch[:0]
		}
		if len(bad) > 0 {
			if err := st.AddIngestErrors(ctx, bad); err != nil {
				return err
			}
			bad = bad[:0]
		}
		return nil
	}
	for _, src := range spec.Sources {
		emit := func(s source.Sample) error {
			stats.Read++
			batch = append(batch, store.NewSample{
				ID: s.ID, Partition: s.Partition, Body: s.Body, PromptTokens: s.PromptTokens, Origin: s.Origin,
				Lane: spec.LaneFor(s.Partition, s.PromptTokens),
			})
			if len(batch) >= ingestBatch {
				return flush()
			}
			return nil
		}
		onBad := func(b source.BadRow) error {
			stats.Read++
			stats.Bad++
			bad = append(bad, store.IngestError{Partition: b.Partition, Origin: b.Origin, Field: b.Field, Reason: b.Reason})
			if len(bad) >= ingestBatch {
				return flush()
			}
			return nil
		}
		if _, err := source.Read(ctx, src, spec.Dir, emit, onBad); err != nil {
			return stats, fmt.Errorf("ingest partition %s: %w", src.Partition, err)
		}
		if err := flush(); err != nil {
			return stats, fmt.Errorf("ingest partition %s: %w", src.Partition, err)
		}
	}
	d, err := st.IngestDuplicates(ctx, 1)
	if err != nil {
		return stats, fmt.Errorf("ingest: %w", err)
	}
	stats.Duplicates = d.Total
	return stats, nil
}
