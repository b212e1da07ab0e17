package postgres

import "strings"

// Dataset statistics move in the statements that store or drop answers,
// like counts: statsCTEs reads a CTE of answers (columns partition, lane,
// finish_reason, rule, reasoning_tokens, end_reason, prompt_tokens,
// completion_tokens, finished_at) and adds (sign 1) or removes (sign -1)
// them from the sharded statistics tables. Minutes only grow: a dropped
// answer was still work done in its minute.
func statsCTEs(src string, sign int, minutes bool) string {
	m := "1"
	if sign < 0 {
		m = "-1"
	}
	shard := `pg_backend_pid() % 256`
	ctes := []string{
		`st_cells AS (
		INSERT INTO stat_cells AS c (partition, lane, shard, requests, truncated, rejected, with_reasoning, ended,
			prompt_tokens, completion_tokens, reasoning_tokens)
		SELECT partition, lane, ` + shard + `, ` + m + ` * count(*),
			` + m + ` * count(*) FILTER (WHERE finish_reason = 'length'), ` + m + ` * count(*) FILTER (WHERE rule <> ''),
			` + m + ` * count(*) FILTER (WHERE reasoning_tokens > 0), ` + m + ` * count(*) FILTER (WHERE end_reason <> ''),
			` + m + ` * sum(prompt_tokens), ` + m + ` * sum(completion_tokens), ` + m + ` * sum(reasoning_tokens)
		FROM ` + src + ` GROUP BY partition, lane ORDER BY partition, lane
		ON CONFLICT (partition, lane, shard) DO UPDATE SET requests = c.requests + excluded.requests,
			truncated = c.truncated + excluded.truncated, rejected = c.rejected + excluded.rejected,
			with_reasoning = c.with_reasoning + excluded.with_reasoning, ended = c.ended + excluded.ended,
			prompt_tokens = c.prompt_tokens + excluded.prompt_tokens,
			completion_tokens = c.completion_tokens + excluded.completion_tokens,
			reasoning_tokens = c.reasoning_tokens + excluded.reasoning_tokens
	)`,
		`st_tokens AS (
		INSERT INTO stat_tokens AS c (partition, lane, kind, tokens, shard, n)
		SELECT partition, lane, kind, tokens, ` + shard + `, ` + m + ` * count(*) FROM (
			SELECT partition, lane, 'prompt' AS kind, prompt_tokens AS tokens FROM ` + src + `
			UNION ALL
			SELECT partition, lane, 'completion', completion_tokens FROM ` + src + `
		) x GROUP BY partition, lane, kind, tokens ORDER BY partition, lane, kind, tokens
		ON CONFLICT (partition, lane, kind, tokens, shard) DO UPDATE SET n = c.n + excluded.n
	)`,
		`st_rejects AS (
		INSERT INTO stat_rejects AS c (partition, lane, rule, shard, n)
		SELECT partition, lane, rule, ` + shard + `, ` + m + ` * count(*) FROM ` + src + ` WHERE rule <> ''
		GROUP BY partition, lane, rule ORDER BY partition, lane, rule
		ON CONFLICT (partition, lane, rule, shard) DO UPDATE SET n = c.n + excluded.n
	)`,
	}
	if minutes {
		ctes = append(ctes, `st_minutes AS (
		INSERT INTO stat_minutes AS c (minute, shard, requests, prompt_tokens, completion_tokens)
		SELECT finished_at / 60000000000, `+shard+`, count(*), sum(prompt_tokens), sum(completion_tokens)
		FROM `+src+` GROUP BY 1 ORDER BY 1
		ON CONFLICT (minute, shard) DO UPDATE SET requests = c.requests + excluded.requests,
			prompt_tokens = c.prompt_tokens + excluded.prompt_tokens,
			completion_tokens = c.completion_tokens + excluded.completion_tokens
	)`)
	}
	return strings.Join(ctes, ", ")
}

// answerCols is what a CTE of stored answers returns for statsCTEs.
const answerCols = `partition, lane, finish_reason, rule, reasoning_tokens, end_reason, prompt_tokens, completion_tokens, finished_at`
