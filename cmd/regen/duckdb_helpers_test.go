package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// duckDBPackage is the DuckDB Node client used as an independent reader
// of the exports. The npm package "duckdb" ships no binary (it downloads
// one from its own server at install, falling back to a 20-minute source
// build); @duckdb/node-api's platform package carries the binary on npm.
const duckDBPackage = "@duckdb/node-api@1.5.6-r.1"

// duckQueryJS runs the SQL statements of argv[2] (a JSON list) and prints
// the rows of each as JSON.
const duckQueryJS = `import { DuckDBInstance } from '@duckdb/node-api';
const db = await DuckDBInstance.create(':memory:');
const c = await db.connect();
const out = [];
for (const q of JSON.parse(process.argv[2])) {
  out.push((await c.runAndReadAll(q)).getRowObjectsJson());
}
console.log(JSON.stringify(out));
`

// duckDB returns a function running SQL in DuckDB under Node. The package
// is installed once into a cache directory (REGEN_DUCKDB_DIR, else the
// user cache) and reused. Without node and npm the test skips, loudly, or
// fails under CI=true, where it must run.
func duckDB(t *testing.T) func(queries ...string) [][]map[string]any {
	t.Helper()
	missing := func(what string, err error) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s: %v (CI must run the independent Parquet reader)", what, err)
		}
		t.Skipf("SKIPPED: no independent Parquet reader: %s: %v", what, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node", err)
	}
	dir := os.Getenv("REGEN_DUCKDB_DIR")
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			missing("cache dir", err)
		}
		dir = filepath.Join(cache, "regen-test", "duckdb-node-api-1.5.6-r.1")
	}
	script := filepath.Join(dir, "query.mjs")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@duckdb", "node-api", "package.json")); err != nil {
		npm, err := exec.LookPath("npm")
		if err != nil {
			missing("npm", err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		install := exec.Command(npm, "install", "--prefix", dir, "--no-audit", "--no-fund", "--no-save", duckDBPackage)
		if out, err := install.CombinedOutput(); err != nil {
			missing("npm install "+duckDBPackage, fmtErr(err, out))
		}
	}
	if err := os.WriteFile(script, []byte(duckQueryJS), 0o644); err != nil {
		t.Fatal(err)
	}
	return func(queries ...string) [][]map[string]any {
		t.Helper()
		q, _ := json.Marshal(queries)
		cmd := exec.Command(node, script, string(q))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("duckdb %s: %v\n%s", q, err, stderr.String())
		}
		var res [][]map[string]any
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("duckdb output %q: %v", out, err)
		}
		return res
	}
}

type cmdError struct {
	err error
	out []byte
}

func (e cmdError) Error() string { return e.err.Error() + ": " + tail(e.out, 800) }

func fmtErr(err error, out []byte) error { return cmdError{err, out} }
