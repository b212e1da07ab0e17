package sqlite

// captureServerPathStep adds captures.server_path: the server's file a
// capture was handed and has not settled yet, so the key's next holder
// removes what a killed worker left in the server's folder. Its own step
// (schema 12 -> 13) so a merge that orders the steps renumbers only
// schemaVersion.
const captureServerPathStep = `
ALTER TABLE captures ADD COLUMN server_path TEXT NOT NULL DEFAULT '';
CREATE INDEX captures_server_path ON captures (server_path) WHERE server_path <> '';
`
