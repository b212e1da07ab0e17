package sqlite

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/regen-dev/regen/internal/store"
)

// crashEnv switches the test binary into the writer child of TestKillMidWrite.
const crashEnv = "REGEN_STORE_CRASH_DB"

// TestCrashChild is the child process: it writes to the store in a loop and
// prints the number of samples it knows are committed done, until killed.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashEnv)
	if path == "" {
		t.Skip("runs only as the child of TestKillMidWrite")
	}
	ctx := context.Background()
	s, err := Open(path)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	round, _ := strconv.Atoi(os.Getenv(crashEnv + "_ROUND"))
	owner := fmt.Sprintf("child-%d", round)
	response := []byte(`{"content":"` + strings.Repeat("x", 1000) + `"}`)
	done := 0
	deadline := time.Now().Add(20 * time.Second) // in case the parent never kills
	for i := 0; time.Now().Before(deadline); i++ {
		var batch []store.NewSample
		for j := range 20 {
			batch = append(batch, newSample(fmt.Sprintf("r%d-%06d", round, i*20+j), "short"))
		}
		if _, err := s.Ingest(ctx, batch); err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		cs, err := s.Claim(ctx, "short", 16, owner, time.Hour)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		for k, c := range cs {
			r := store.Result{Response: response, FinishReason: "stop", PromptTokens: 10, CompletionTokens: 250}
			switch k % 4 {
			case 0, 1:
				err = s.Complete(ctx, c.ID, owner, r)
				if err == nil {
					done++
				}
			case 2:
				err = s.Reject(ctx, c.ID, owner, r, "empty", "bad")
			case 3:
				err = s.Retry(ctx, c.ID, owner, time.Now(), "503")
			}
			if err != nil {
				fmt.Println("error", err)
				os.Exit(2)
			}
		}
		fmt.Printf("committed %d\n", done)
	}
	s.Close()
}

// TestKillMidWrite SIGKILLs a child writing to the store, several times on
// the same file, and checks after each kill that the file is consistent and
// holds everything the child saw committed.
func TestKillMidWrite(t *testing.T) {
	if os.Getenv(crashEnv) != "" {
		t.Skip("in the child")
	}
	path := filepath.Join(t.TempDir(), "job.db")
	ctx := context.Background()
	totalDone := 0
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashEnv+"="+path, fmt.Sprintf("%s_ROUND=%d", crashEnv, round))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		reported, lines := 0, 0
		// Kill at a different point each round, mid-stream.
		for sc.Scan() && lines < 10+15*round {
			line := sc.Text()
			if strings.HasPrefix(line, "error") {
				t.Fatalf("child round %d: %s", round, line)
			}
			if n, ok := strings.CutPrefix(line, "committed "); ok {
				reported, _ = strconv.Atoi(n)
				lines++
			}
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatalf("kill child: %v", err)
		}
		_ = cmd.Wait()
		if lines == 0 {
			t.Fatalf("round %d: child reported nothing before the kill", round)
		}

		s, err := Open(path)
		if err != nil {
			t.Fatalf("round %d: reopen after kill: %v", round, err)
		}
		checkConsistent(t, s.DB())
		var done int
		if err := s.DB().QueryRow(`SELECT count(*) FROM samples WHERE state = 'done'`).Scan(&done); err != nil {
			t.Fatal(err)
		}
		// The child may pick up earlier rounds' retried samples, so count
		// all done samples against all that were ever reported committed.
		if done < totalDone+reported {
			t.Errorf("round %d: %d done after the kill, but %d were done before and the child saw %d more committed",
				round, done, totalDone, reported)
		}
		totalDone = done
		// The dead child's leases come back, and the store keeps working.
		if _, err := s.ReleaseOwner(ctx, fmt.Sprintf("child-%d", round)); err != nil {
			t.Fatal(err)
		}
		checkConsistent(t, s.DB())
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d samples done across 3 kills", totalDone)
}
