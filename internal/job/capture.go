package job

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Capture is hidden-state capture (package capture): after generation,
// every done sample with token ids (a whole conversation, or each turn row
// with output.token_rows: turn) is sent to a capture server, which writes
// the target model's hidden states to a file regen checks and moves into
// Dir. It changes no request of generation and so no answer.
type Capture struct {
	// Endpoints are the capture servers (vLLM with the extract_hidden_states
	// speculative method and a hidden-states connector), separate from the
	// generation endpoints: they write files to a folder regen can read.
	Endpoints []CaptureEndpoint `yaml:"endpoints"`
	// Concurrency is how many captures are in flight at once over all
	// capture endpoints; default DefaultCaptureConcurrency.
	Concurrency int `yaml:"concurrency"`
	// Dir is the folder the checked files are moved into, relative to the
	// job file; default DefaultCaptureDir. Absolute after defaults.
	Dir string `yaml:"dir"`
	// Model is the model name sent; default: the job's model ("" sends
	// none: vLLM then takes the one it serves).
	Model string `yaml:"model"`
	// Layers, Hidden and DType are what every file must hold; unset, the
	// first file fixes them for the rest of the run.
	Layers int    `yaml:"layers"`
	Hidden int    `yaml:"hidden"`
	DType  string `yaml:"dtype"` // bf16 | f16 | f32
	// MaxAttempts is how many times a capture whose own file is bad (NaN,
	// wrong ids, truncated...) is tried before it is dead; server outages
	// spend none. Default DefaultCaptureAttempts.
	MaxAttempts int `yaml:"max_attempts"`
	// RequestTimeout bounds one capture request.
	RequestTimeout time.Duration `yaml:"request_timeout"`
	// FileWait bounds the wait for the server to finish writing a file
	// after answering (its connector holds <file>.lock meanwhile); a file
	// still being written then is a failed attempt (slow).
	FileWait time.Duration `yaml:"file_wait"`
	// DownAfter stops the capture with an error once every capture
	// endpoint has been down this long; 0 waits for ever.
	DownAfter time.Duration `yaml:"down_after"`
}

// CaptureEndpoint is one capture server.
type CaptureEndpoint struct {
	URL       string `yaml:"url"`
	APIKeyEnv string `yaml:"api_key_env"` // name of the env var holding the key
}

// Defaults of the capture section.
const (
	DefaultCaptureConcurrency    = 4
	DefaultCaptureDir            = "hidden_states"
	DefaultCaptureAttempts       = 3
	DefaultCaptureRequestTimeout = 10 * time.Minute
	DefaultCaptureFileWait       = time.Minute
	DefaultCaptureDownAfter      = 10 * time.Minute
)

// CaptureDTypes are the dtypes a capture may expect.
var CaptureDTypes = []string{"bf16", "f16", "f32"}

// captureDefaults fills the capture section's unset options.
func (s *Spec) captureDefaults() {
	c := s.Capture
	if c == nil {
		return
	}
	setInt(s, &c.Concurrency, "capture.concurrency", DefaultCaptureConcurrency)
	setInt(s, &c.MaxAttempts, "capture.max_attempts", DefaultCaptureAttempts)
	setDur(s, &c.RequestTimeout, "capture.request_timeout", DefaultCaptureRequestTimeout)
	setDur(s, &c.DownAfter, "capture.down_after", DefaultCaptureDownAfter)
	setDur(s, &c.FileWait, "capture.file_wait", DefaultCaptureFileWait)
	if c.Dir == "" && s.unset("capture.dir") {
		c.Dir = DefaultCaptureDir
	}
	if c.Dir != "" {
		c.Dir = filepath.Clean(s.resolve(c.Dir))
	}
	if c.Model == "" {
		c.Model = s.Model
	}
	c.DType = strings.ToLower(strings.TrimSpace(c.DType))
	for i := range c.Endpoints {
		c.Endpoints[i].URL = serverRootURL(c.Endpoints[i].URL)
	}
}

// capture checks the capture section.
func (v *validator) capture() {
	c := v.s.Capture
	if c == nil {
		return
	}
	if len(c.Endpoints) == 0 {
		v.addf("capture.endpoints", "at least one capture server is required ({url: http://host:port})")
	}
	seen := map[string]int{}
	for i, e := range c.Endpoints {
		v.endpointURL("capture.endpoints", i, e.URL, seen)
		if e.APIKeyEnv != "" && !envNameRE.MatchString(e.APIKeyEnv) {
			v.addf(fmt.Sprintf("capture.endpoints[%d].api_key_env", i), "%q is not an environment variable name (letters, digits and _)", e.APIKeyEnv)
		}
	}
	if !v.s.Output.TokenIDs {
		v.addf("capture", "needs output.token_ids: true (the capture sends each sample's exact token ids)")
	}
	if c.Concurrency < 1 {
		v.addf("capture.concurrency", "must be >= 1")
	}
	if c.Dir == "" {
		v.addf("capture.dir", "must name a folder (default %s)", DefaultCaptureDir)
	} else if c.Dir == filepath.Clean(v.s.Dir) {
		v.addf("capture.dir", "must be a folder of its own, not the job's folder")
	}
	if c.Layers < 0 {
		v.addf("capture.layers", "must be >= 0 (0 = as the first file says)")
	}
	if c.Hidden < 0 {
		v.addf("capture.hidden", "must be >= 0 (0 = as the first file says)")
	}
	if c.DType != "" && !slices.Contains(CaptureDTypes, c.DType) {
		v.addf("capture.dtype", "unknown dtype %q (want %s, or leave it out to take the first file's)", c.DType, strings.Join(CaptureDTypes, ", "))
	}
	if c.MaxAttempts < 1 {
		v.addf("capture.max_attempts", "must be >= 1")
	}
	if c.RequestTimeout <= 0 {
		v.addf("capture.request_timeout", "must be > 0")
	}
	if c.FileWait <= 0 {
		v.addf("capture.file_wait", "must be > 0")
	}
	if c.DownAfter < 0 {
		v.addf("capture.down_after", "must be >= 0 (0 waits for ever)")
	}
}
