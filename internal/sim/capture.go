package sim

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nlpodyssey/safetensors"
)

// Hidden-state capture imitates vLLM's extract_hidden_states speculative
// method with its hidden-states connector (docs/engines.md §14): a
// completion's prompt is prefilled, and the connector writes one
// safetensors file per request, <shared_storage_path>/<request id>.safetensors
// with token_ids (int64 [seq]) and hidden_states ([seq, layers, hidden]),
// naming it in the answer's top-level kv_transfer_params.hidden_states_path.
// The connector writes asynchronously, after the path is returned, so it
// guards each file with a companion <path>.lock held under flock(LOCK_EX)
// from before the answer until the write ends (or fails); a reader takes the
// lock before reading. The simulator holds the same lock. It finishes the
// file before answering, except under the slow fault, which answers first.

// Faults of the hidden-state files (Config.HiddenStatesFault).
const (
	HiddenFaultNaN            = "nan"              // one element of hidden_states is NaN
	HiddenFaultInf            = "inf"              // one element of hidden_states is +Inf
	HiddenFaultWrongIDs       = "wrong-ids"        // one id of the file's token_ids differs from the prompt
	HiddenFaultMissing        = "missing"          // the answer names a path with no file (the write failed)
	HiddenFaultTruncated      = "truncated"        // the file is cut to half its bytes
	HiddenFaultSlow           = "slow"             // the answer comes first, the file HiddenStatesSlow later
	HiddenFaultWrongPromptIDs = "wrong-prompt-ids" // one id of the answer's prompt_token_ids differs
)

var hiddenFaults = []string{HiddenFaultNaN, HiddenFaultInf, HiddenFaultWrongIDs, HiddenFaultMissing, HiddenFaultTruncated, HiddenFaultSlow, HiddenFaultWrongPromptIDs}

var hiddenDTypes = map[string]safetensors.DType{"bf16": safetensors.BF16, "f16": safetensors.F16, "f32": safetensors.F32}

func (c *Config) validateCapture() error {
	if c.HiddenStates == "" {
		return nil
	}
	known := c.HiddenStatesFault == ""
	_, dtypeOK := hiddenDTypes[c.HiddenDType]
	for _, f := range hiddenFaults {
		known = known || c.HiddenStatesFault == f
	}
	switch {
	case c.Engine != EngineVLLM:
		return fmt.Errorf("hidden-states: vLLM's contract, want --engine vllm (got %s)", c.Engine)
	case c.HiddenSize < 1 || c.HiddenLayers < 1:
		return fmt.Errorf("hidden-size %d, layers %d: want at least 1", c.HiddenSize, c.HiddenLayers)
	case !dtypeOK:
		return fmt.Errorf("hidden-dtype %q: want bf16, f16 or f32", c.HiddenDType)
	case !known:
		return fmt.Errorf("hidden-states-fault %q: want one of %v", c.HiddenStatesFault, hiddenFaults)
	case c.HiddenStatesFaultEvery < 1:
		return fmt.Errorf("hidden-states-fault-every %d: want at least 1", c.HiddenStatesFaultEvery)
	}
	return nil
}

// HiddenValue is the value the simulator writes for element j of layer
// layer of a token with id id: a multiple of 1/128 in [-1, 1), exact in
// bf16, f16 and f32, so a reader can re-derive every file.
func HiddenValue(id int64, layer, j int) float32 {
	h := splitmix64(uint64(id)*0x9e3779b97f4a7c15 ^ uint64(layer)<<40 ^ uint64(j))
	return float32(int8(h>>56)) / 128
}

// capture is one request's hidden-state file as the answer names it.
type capture struct {
	id        string  // the request id the file is named after
	path      string  // absolute
	sent      []int64 // the prompt as sent: what the hidden states are of
	fileIDs   []int64 // token_ids written in the file
	promptIDs []int64 // prompt_token_ids in the answer
	fault     string
}

// newCapture names the file of a request whose prompt was ids and decides
// its fault: every HiddenStatesFaultEvery-th capture request gets it.
func (s *Server) newCapture(ids []int64) (*capture, error) {
	dir, err := filepath.Abs(s.cfg.HiddenStates)
	if err != nil {
		return nil, fmt.Errorf("hidden states dir: %w", err)
	}
	var b [16]byte
	rand.Read(b[:])
	id := "cmpl-" + hex.EncodeToString(b[:]) + "-0"
	c := &capture{id: id, path: filepath.Join(dir, id+".safetensors"), sent: ids, fileIDs: ids, promptIDs: ids}
	if n := s.captures.Add(1); s.cfg.HiddenStatesFault != "" && n%int64(s.cfg.HiddenStatesFaultEvery) == 0 {
		c.fault = s.cfg.HiddenStatesFault
	}
	switch c.fault {
	case HiddenFaultWrongIDs:
		c.fileIDs = changedID(ids)
	case HiddenFaultWrongPromptIDs:
		c.promptIDs = changedID(ids)
	}
	return c, nil
}

// changedID is ids with the id in the middle changed.
func changedID(ids []int64) []int64 {
	out := append([]int64(nil), ids...)
	if len(out) > 0 {
		out[len(out)/2]++
	}
	return out
}

// writeCapture writes the file as the connector does: lock first, then the file in
// place, then the lock released. It returns once the answer may be sent:
// under the slow fault the file is still being written then (by a goroutine
// that ends with the server).
func (s *Server) writeCapture(c *capture) error {
	if err := os.MkdirAll(filepath.Dir(c.path), 0o755); err != nil {
		return fmt.Errorf("hidden states %s: %w", c.path, err)
	}
	lock, err := os.OpenFile(c.path+".lock", os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("hidden states lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		return fmt.Errorf("hidden states lock %s: %w", lock.Name(), err)
	}
	if c.fault == HiddenFaultSlow {
		s.writers.Add(1)
		go func() {
			defer s.writers.Done()
			defer lock.Close() // releases LOCK_EX
			s.writeSlow(c)
		}()
		return nil
	}
	defer lock.Close()
	if err := s.writeFile(c); err != nil {
		// The connector logs a failed write and releases the lock; the
		// answer already names the path.
		s.log.vllm("ERROR", "example_hidden_states_connector.py:282", "Hidden-states write failed for req_id=%s: %v", c.id, err)
	}
	return nil
}

func (s *Server) writeFile(c *capture) error {
	switch c.fault {
	case HiddenFaultMissing:
		return fmt.Errorf("simulated fault: %s not written", c.path)
	case HiddenFaultTruncated:
		var buf bytes.Buffer
		if err := s.serialize(c, &buf); err != nil {
			return err
		}
		return os.WriteFile(c.path, buf.Bytes()[:buf.Len()/2], 0o644)
	}
	f, err := os.Create(c.path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	err = s.serialize(c, w)
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeSlow writes half the file, waits HiddenStatesSlow (simulated), then
// writes the rest; a server that ends meanwhile leaves the half file.
func (s *Server) writeSlow(c *capture) {
	var buf bytes.Buffer
	if err := s.serialize(c, &buf); err != nil {
		s.log.vllm("ERROR", "example_hidden_states_connector.py:282", "Hidden-states write failed for req_id=%s: %v", c.id, err)
		return
	}
	f, err := os.Create(c.path)
	if err != nil {
		s.log.vllm("ERROR", "example_hidden_states_connector.py:282", "Hidden-states write failed for req_id=%s: %v", c.id, err)
		return
	}
	defer f.Close()
	half := buf.Len() / 2
	f.Write(buf.Bytes()[:half])
	t := time.NewTimer(s.sched.realDelay(s.cfg.HiddenStatesSlow))
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return
	case <-t.C:
	}
	f.Write(buf.Bytes()[half:])
}

// serialize writes the safetensors bytes of c to w.
func (s *Server) serialize(c *capture, w interface{ Write([]byte) (int, error) }) error {
	seq := len(c.fileIDs)
	idBytes := make([]byte, 8*seq)
	for i, id := range c.fileIDs {
		binary.LittleEndian.PutUint64(idBytes[8*i:], uint64(id))
	}
	ids, err := safetensors.NewTensorView(safetensors.I64, []uint64{uint64(seq)}, idBytes)
	if err != nil {
		return fmt.Errorf("token_ids: %w", err)
	}
	dt := hiddenDTypes[s.cfg.HiddenDType]
	hs, err := safetensors.NewTensorView(dt, []uint64{uint64(seq), uint64(s.cfg.HiddenLayers), uint64(s.cfg.HiddenSize)},
		hiddenBytes(c, dt, s.cfg.HiddenLayers, s.cfg.HiddenSize))
	if err != nil {
		return fmt.Errorf("hidden_states: %w", err)
	}
	return safetensors.SerializeToWriter(map[string]safetensors.TensorView{"token_ids": ids, "hidden_states": hs}, nil, w)
}

// hiddenBytes are the hidden states of the prompt's ids (the prompt sent,
// not the file's possibly changed ids), with a NaN under the nan fault.
func hiddenBytes(c *capture, dt safetensors.DType, layers, hidden int) []byte {
	size := int(dt.Size())
	ids := c.sent
	out := make([]byte, 0, len(ids)*layers*hidden*size)
	for _, id := range ids {
		for l := range layers {
			for j := range hidden {
				out = appendFloat(out, dt, HiddenValue(id, l, j))
			}
		}
	}
	if bad, ok := map[string]float64{HiddenFaultNaN: math.NaN(), HiddenFaultInf: math.Inf(1)}[c.fault]; ok && len(out) > 0 {
		// The middle token's first element of the first layer.
		at := len(ids) / 2 * layers * hidden * size
		appendFloat(out[:at], dt, float32(bad))
	}
	return out
}

// appendFloat appends v in dt's little-endian encoding; v has at most 8
// significant bits (HiddenValue), or is NaN or infinite.
func appendFloat(b []byte, dt safetensors.DType, v float32) []byte {
	bits := math.Float32bits(v)
	switch dt {
	case safetensors.F32:
		return binary.LittleEndian.AppendUint32(b, bits)
	case safetensors.BF16:
		return binary.LittleEndian.AppendUint16(b, uint16(bits>>16))
	}
	return binary.LittleEndian.AppendUint16(b, float16Bits(v))
}

// float16Bits converts v to IEEE half precision, exactly for the values
// HiddenValue gives (normal, 8 significant bits, |v| >= 2^-7) and zero.
func float16Bits(v float32) uint16 {
	bits := math.Float32bits(v)
	sign := uint16(bits>>16) & 0x8000
	switch {
	case v != v:
		return 0x7e00
	case math.IsInf(float64(v), 0):
		return sign | 0x7c00
	case v == 0:
		return sign
	}
	exp := int(bits>>23&0xff) - 127 + 15
	return sign | uint16(exp)<<10 | uint16(bits>>13&0x3ff)
}
