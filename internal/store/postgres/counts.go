package postgres

// Per-(partition, lane, state) counts move in the same statement as the
// samples they count: each statement that changes a sample's state or lane
// is an UPDATE in a CTE named u whose RETURNING gives, per row, partition,
// lane_from, state_from (before), lane and state (after); movedSQL adds a
// second CTE that moves the counts. One statement, no trigger: the cost is
// one small upsert per statement, whatever the number of rows.
//
// Count rows are sharded by the writing backend (pg_backend_pid() % 256), so
// concurrent workers never queue on one hot row; Counts sums the shards.
// Within a statement rows are upserted in (partition, lane, state) order, so
// two statements on one shard lock them in the same order.

// countsCTE moves the counts of the rows CTE u returned.
const countsCTE = `counted AS (
		INSERT INTO counts AS c (partition, lane, state, shard, n)
		SELECT partition, lane, state, pg_backend_pid() % 256, sum(d) FROM (
			SELECT partition, lane_from AS lane, state_from AS state, -1 AS d FROM u
			UNION ALL
			SELECT partition, lane, state, 1 AS d FROM u
		) x
		GROUP BY partition, lane, state HAVING sum(d) <> 0 ORDER BY partition, lane, state
		ON CONFLICT (partition, lane, state, shard) DO UPDATE SET n = c.n + excluded.n
	)`

// movedSQL runs update (an UPDATE samples ... RETURNING partition,
// lane_from, state_from, lane, state and any more columns) with its counts
// moved, and selects out (columns of u) from it: its row count is the
// number of samples changed.
func movedSQL(update, out string) string {
	return `WITH u AS (` + update + `), ` + countsCTE + ` SELECT ` + out + ` FROM u`
}

// moved is the RETURNING list of an update that keeps the lane and moves
// the state from one known value.
func moved(fromState string) string {
	return `RETURNING partition, lane AS lane_from, ` + fromState + `::int2 AS state_from, lane, state`
}
