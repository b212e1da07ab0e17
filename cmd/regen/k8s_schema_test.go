package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// k8sSchemaDir holds the pinned Kubernetes version's OpenAPI v3 documents
// (see its README.md); the tests read nothing from the network.
const k8sSchemaDir = "testdata/kubernetes-v1.33.13"

// k8sSchemas validates Kubernetes objects against the vendored OpenAPI
// documents, strictly: a field the API does not define is an error, as
// `kubectl apply --validate=strict` makes it.
type k8sSchemas struct {
	compiler *jsonschema.Compiler
	docs     map[string]map[string]any // document URL -> its JSON
	compiled map[string]*jsonschema.Schema
}

func newK8sSchemas() *k8sSchemas {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	// Every document is added by hand: a $ref to anything else fails
	// instead of reaching for a file or the network.
	c.UseLoader(jsonschema.SchemeURLLoader{})
	return &k8sSchemas{compiler: c, docs: map[string]map[string]any{}, compiled: map[string]*jsonschema.Schema{}}
}

// schema returns the schema of apiVersion's kind: the one whose
// x-kubernetes-group-version-kind names it, in its group version's document.
func (s *k8sSchemas) schema(apiVersion, kind string) (*jsonschema.Schema, error) {
	key := apiVersion + " " + kind
	if sch, ok := s.compiled[key]; ok {
		return sch, nil
	}
	group, version, ok := strings.Cut(apiVersion, "/")
	file := "api__" + apiVersion + "_openapi.json"
	if ok {
		file = "apis__" + group + "__" + version + "_openapi.json"
	} else {
		group, version = "", apiVersion
	}
	url := "file:///kubernetes/" + file
	doc, err := s.doc(url, filepath.Join(k8sSchemaDir, file))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no apiVersion %s in %s", apiVersion, k8sSchemaDir)
	}
	if err != nil {
		return nil, fmt.Errorf("apiVersion %s: %w", apiVersion, err)
	}
	schemas, _ := doc["components"].(map[string]any)["schemas"].(map[string]any)
	for name, def := range schemas {
		gvks, _ := def.(map[string]any)["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			g, _ := g.(map[string]any)
			if g["group"] == group && g["version"] == version && g["kind"] == kind {
				sch, err := s.compiler.Compile(url + "#/components/schemas/" + name)
				if err != nil {
					return nil, fmt.Errorf("compile %s: %w", name, err)
				}
				s.compiled[key] = sch
				return sch, nil
			}
		}
	}
	return nil, fmt.Errorf("no kind %s in apiVersion %s (%s)", kind, apiVersion, k8sSchemaDir)
}

// doc loads one OpenAPI document, made strict, and adds it to the compiler.
func (s *k8sSchemas) doc(url, path string) (map[string]any, error) {
	if d, ok := s.docs[url]; ok {
		return d, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	v, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	d, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: not a JSON object", path)
	}
	closeObjects(d["components"])
	if err := s.compiler.AddResource(url, d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s.docs[url] = d
	return d, nil
}

// closeObjects forbids undefined fields: every object schema that lists its
// properties, leaves additionalProperties open and does not ask to keep
// unknown fields gets additionalProperties false (the API server's strict
// field validation; OpenAPI leaves it implicit).
func closeObjects(v any) {
	switch v := v.(type) {
	case map[string]any:
		_, props := v["properties"]
		_, open := v["additionalProperties"]
		_, keep := v["x-kubernetes-preserve-unknown-fields"]
		if props && !open && !keep {
			v["additionalProperties"] = false
		}
		for _, x := range v {
			closeObjects(x)
		}
	case []any:
		for _, x := range v {
			closeObjects(x)
		}
	}
}

// validateManifest validates every document of a manifest's text and
// returns one error per invalid document, naming it.
func (s *k8sSchemas) validateManifest(name string, text []byte) (kinds []string, errs []error) {
	for i, doc := range bytes.Split(text, []byte("\n---\n")) {
		where := fmt.Sprintf("%s document %d", name, i+1)
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		obj, _ := v.(map[string]any)
		apiVersion, _ := obj["apiVersion"].(string)
		kind, _ := obj["kind"].(string)
		sch, err := s.schema(apiVersion, kind)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		if err := sch.Validate(v); err != nil {
			errs = append(errs, fmt.Errorf("%s (%s %s): %w", where, apiVersion, kind, err))
			continue
		}
		kinds = append(kinds, kind)
	}
	return kinds, errs
}

// TestKubernetesManifestSchemas validates the example's manifests against
// the API schemas of Kubernetes v1.33.13, strictly.
func TestKubernetesManifestSchemas(t *testing.T) {
	s := newK8sSchemas()
	var all []string
	for _, f := range []string{"postgres.yaml", "regen-job.yaml"} {
		text, err := os.ReadFile(filepath.Join("../../examples/kubernetes", f))
		if err != nil {
			t.Fatal(err)
		}
		kinds, errs := s.validateManifest(f, text)
		for _, err := range errs {
			t.Error(err)
		}
		all = append(all, kinds...)
	}
	if got, want := strings.Join(all, " "), "Service StatefulSet ConfigMap Job"; got != want {
		t.Errorf("valid objects %q, want %q", got, want)
	}
}

// TestKubernetesSchemaCatchesTypos validates corrupted copies of the
// example's manifests: each typo'd field, wrong type or unknown kind must
// fail, and the error must name what is wrong.
func TestKubernetesSchemaCatchesTypos(t *testing.T) {
	tests := []struct {
		name, file, old, new, wantErr string
	}{
		{"typo in the sidecar's restartPolicy", "regen-job.yaml", "restartPolicy: Always", "restartPolicyy: Always", "restartPolicyy"},
		{"typo in the Job spec", "regen-job.yaml", "completions: 4", "completion: 4", "completion"},
		{"wrong case in a volume mount", "regen-job.yaml", "{name: config, mountPath: /config}", "{name: config, mountpath: /config}", "mountpath"},
		{"typo under a probe", "regen-job.yaml", "initialDelaySeconds: 30", "initialDelaySecond: 30", "initialDelaySecond"},
		{"string for an integer", "regen-job.yaml", "backoffLimit: 20", `backoffLimit: "20"`, "/spec/backoffLimit"},
		{"list for an object", "postgres.yaml", "selector: {app: regen-postgres}", "selector: [regen-postgres]", "/spec/selector"},
		{"typo in the Service port", "postgres.yaml", "targetPort: 5432", "targetPortt: 5432", "targetPortt"},
		{"unknown kind", "postgres.yaml", "kind: StatefulSet", "kind: StatefulSett", "no kind StatefulSett"},
		{"unknown apiVersion", "regen-job.yaml", "apiVersion: batch/v1", "apiVersion: batch/v2", "no apiVersion batch/v2"},
	}
	s := newK8sSchemas()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			text, err := os.ReadFile(filepath.Join("../../examples/kubernetes", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(text, []byte(tc.old)); n != 1 {
				t.Fatalf("%s holds %q %d times, want once: the corruption would not apply", tc.file, tc.old, n)
			}
			bad := bytes.Replace(text, []byte(tc.old), []byte(tc.new), 1)
			_, errs := s.validateManifest(tc.file, bad)
			if len(errs) != 1 {
				t.Fatalf("corrupted copy: %d errors, want 1: %v", len(errs), errs)
			}
			t.Logf("%v", errs[0])
			if !strings.Contains(errs[0].Error(), tc.wantErr) {
				t.Errorf("error %q does not name %q", errs[0], tc.wantErr)
			}
		})
	}
}
