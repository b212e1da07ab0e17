package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"

	"github.com/regen-dev/regen/internal/job"
	"github.com/regen-dev/regen/internal/store/backend"
)

// k8sObject is the part of a Kubernetes manifest the checks read.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Template struct {
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type podSpec struct {
	RestartPolicy  string      `yaml:"restartPolicy"`
	InitContainers []container `yaml:"initContainers"`
	Containers     []container `yaml:"containers"`
}

type container struct {
	Name          string   `yaml:"name"`
	Image         string   `yaml:"image"`
	RestartPolicy string   `yaml:"restartPolicy"`
	Command       []string `yaml:"command"`
	Args          []string `yaml:"args"`
	Env           []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	LivenessProbe *struct {
		Exec struct {
			Command []string `yaml:"command"`
		} `yaml:"exec"`
	} `yaml:"livenessProbe"`
}

// k8sObjects decodes every document of a manifest file.
func k8sObjects(t *testing.T, path string) []k8sObject {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []k8sObject
	for i, doc := range bytes.Split(b, []byte("\n---\n")) {
		var o k8sObject
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("%s document %d: %v", path, i+1, err)
		}
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Errorf("%s document %d: want apiVersion, kind and metadata.name, got %+v", path, i+1, o)
		}
		out = append(out, o)
	}
	return out
}

// checkRegenArgs runs the regen binary with args (a job file path in them
// replaced by a real one) and --help: cobra parses the flags first, so an
// unknown subcommand or flag fails.
func checkRegenArgs(t *testing.T, where string, args []string, jobPath string) {
	t.Helper()
	var argv []string
	for _, a := range args {
		if strings.HasSuffix(a, ".yaml") {
			a = jobPath
		}
		argv = append(argv, a)
	}
	out, err := exec.Command(regenBin, append(argv, "--help")...).CombinedOutput()
	if err != nil {
		t.Errorf("%s: regen %s: %v\n%s", where, strings.Join(argv, " "), err, out)
	}
}

// writeJob writes a job file's text into a temporary directory and loads it
// as `regen run` would (sources are checked by `regen validate`, not here:
// they live on the cluster).
func writeJob(t *testing.T, name, text string) (string, *job.Spec) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := job.Load(path)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return path, spec
}

// TestKubernetesExample: the manifests are well-formed Kubernetes objects;
// the job file in the ConfigMap is a valid regen job sending to the pod's
// own server; the worker's store comes from REGEN_STORE without a password;
// the server runs as a native sidecar; regen's arguments and its liveness
// probe use commands and flags regen has.
func TestKubernetesExample(t *testing.T) {
	dir := "../../examples/kubernetes"
	kinds := map[string]k8sObject{}
	for _, f := range []string{"postgres.yaml", "regen-job.yaml"} {
		for _, o := range k8sObjects(t, filepath.Join(dir, f)) {
			kinds[o.Kind] = o
		}
	}
	for _, k := range []string{"Service", "StatefulSet", "ConfigMap", "Job"} {
		if _, ok := kinds[k]; !ok {
			t.Errorf("no %s in the Kubernetes example", k)
		}
	}
	text, ok := kinds["ConfigMap"].Data["job.yaml"]
	if !ok {
		t.Fatal("the ConfigMap holds no job.yaml")
	}
	jobPath, spec := writeJob(t, "job.yaml", text)
	if len(spec.Endpoints) != 1 || spec.Endpoints[0].URL != "http://127.0.0.1:30000" || spec.Server != nil {
		t.Errorf("job endpoints %+v server %+v: want the pod's own server at 127.0.0.1:30000", spec.Endpoints, spec.Server)
	}

	pod := kinds["Job"].Spec.Template.Spec
	if len(pod.InitContainers) != 1 || pod.InitContainers[0].RestartPolicy != "Always" {
		t.Errorf("the server must be a native sidecar (an init container with restartPolicy Always): %+v", pod.InitContainers)
	} else if cmd := strings.Join(pod.InitContainers[0].Command, " "); !strings.Contains(cmd, "--port 30000") || !strings.Contains(cmd, "--host 127.0.0.1") {
		t.Errorf("sidecar command %q does not serve 127.0.0.1:30000", cmd)
	}
	var regenC *container
	for i := range pod.Containers {
		if pod.Containers[i].Name == "regen" {
			regenC = &pod.Containers[i]
		}
	}
	if regenC == nil {
		t.Fatal("no regen container")
	}
	checkRegenArgs(t, "regen container", regenC.Args, jobPath)
	for _, e := range regenC.Env {
		if e.Name != backend.EnvStore {
			continue
		}
		t.Setenv(backend.EnvStore, e.Value)
		target, err := backend.Resolve(spec)
		if err != nil || target.Backend != "postgres" {
			t.Errorf("REGEN_STORE %q: %v %+v, want a postgres store", e.Value, err, target)
		}
		if strings.Contains(e.Value, ":@") || regexp.MustCompile(`//[^/@]*:[^/@]*@`).MatchString(e.Value) {
			t.Errorf("REGEN_STORE %q holds a password; it belongs in the Secret (PGPASSWORD)", e.Value)
		}
	}
	if regenC.LivenessProbe == nil {
		t.Fatal("regen container has no liveness probe")
	}
	probe := strings.Join(regenC.LivenessProbe.Exec.Command, " ")
	m := regexp.MustCompile(`regen (status [^;>]*)`).FindStringSubmatch(probe)
	if m == nil || !strings.Contains(m[1], "--host") {
		t.Fatalf("liveness probe %q does not run regen status --host", probe)
	}
	checkRegenArgs(t, "liveness probe", strings.Fields(strings.ReplaceAll(m[1], `"$HOSTNAME"`, "node-1")), jobPath)
}

// TestSlurmExample: the batch script is valid bash, its job file a valid
// regen job with a server per node and a shared output directory, and every
// regen command line in the script uses commands and flags regen has.
func TestSlurmExample(t *testing.T) {
	dir := "../../examples/slurm"
	script := filepath.Join(dir, "regen.sbatch")
	if out, err := exec.Command("bash", "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("bash -n %s: %v\n%s", script, err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "job.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	jobPath, spec := writeJob(t, "job.yaml", string(b))
	if spec.Server == nil || spec.Server.Engine != "sglang" {
		t.Errorf("the Slurm job must launch a server per node: %+v", spec.Server)
	}
	sb, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(sb), "REGEN_STORE:?") {
		t.Error("regen.sbatch does not insist on REGEN_STORE")
	}
	n := 0
	for _, m := range regexp.MustCompile(`"\$REGEN" ([a-z]+(?: --?[a-z-]+(?: [0-9]+s)?)*) "\$JOB"`).FindAllStringSubmatch(string(sb), -1) {
		checkRegenArgs(t, "regen.sbatch", append(strings.Fields(m[1]), "job.yaml"), jobPath)
		n++
	}
	if n < 3 {
		t.Errorf("found %d regen command lines in regen.sbatch, want validate, run and status", n)
	}
}
