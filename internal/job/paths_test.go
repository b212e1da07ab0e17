package job

import (
	"path/filepath"
	"testing"
)

func TestRelTo(t *testing.T) {
	tests := []struct {
		name, dir, p, want string
	}{
		{"inside", "/jobs/demo", "/jobs/demo/out/demo.rejected.jsonl", "out/demo.rejected.jsonl"},
		{"origin with line", "/jobs/demo", "/jobs/demo/data/a.jsonl:43", "data/a.jsonl:43"},
		{"parquet origin", "/jobs/demo", "/jobs/demo/data/b.parquet:row 7", "data/b.parquet:row 7"},
		{"the folder itself", "/jobs/demo", "/jobs/demo", "."},
		{"outside stays absolute", "/jobs/demo", "/data/shared/a.jsonl", "/data/shared/a.jsonl"},
		{"sibling stays absolute", "/jobs/demo", "/jobs/demo2/out", "/jobs/demo2/out"},
		{"parent stays absolute", "/jobs/demo", "/jobs", "/jobs"},
		{"a file named ..x is inside", "/jobs/demo", "/jobs/demo/..x", "..x"},
		{"already relative", "/jobs/demo", "out/x.jsonl", "out/x.jsonl"},
		{"dsn", "/jobs/demo", "postgres://u@h/db", "postgres://u@h/db"},
		{"no job folder", "", "/jobs/demo/out", "/jobs/demo/out"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RelTo(tt.dir, tt.p); got != tt.want {
				t.Errorf("RelTo(%q, %q) = %q, want %q", tt.dir, tt.p, got, tt.want)
			}
		})
	}
}

func TestRelText(t *testing.T) {
	s := &Spec{Dir: "/jobs/demo"}
	got := s.RelText("source C: read /jobs/demo/more.jsonl.gz line 987: corrupt; stat /jobs/demo2/x: no such file; /jobs/demo/data/a.jsonl")
	want := "source C: read more.jsonl.gz line 987: corrupt; stat /jobs/demo2/x: no such file; data/a.jsonl"
	if got != want {
		t.Errorf("RelText:\n got %q\nwant %q", got, want)
	}
}

// TestFromRel: a recorded path comes back absolute and clean, joined
// under the job folder unless it was recorded absolute, and RelTo of the
// result records it the same way again.
func TestFromRel(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(t.TempDir(), "elsewhere", "a.safetensors")
	for _, c := range []struct{ rec, want string }{
		{"hidden_states/a.safetensors", filepath.Join(dir, "hidden_states", "a.safetensors")},
		{"hidden_states/../hidden_states/./a.safetensors", filepath.Join(dir, "hidden_states", "a.safetensors")},
		{out, out},
	} {
		got := FromRel(dir, c.rec)
		if got != c.want {
			t.Errorf("FromRel(%q) = %q, want %q", c.rec, got, c.want)
		}
		if back := filepath.ToSlash(RelTo(dir, got)); back != filepath.ToSlash(filepath.Clean(c.rec)) {
			t.Errorf("RelTo(FromRel(%q)) = %q", c.rec, back)
		}
	}
}
