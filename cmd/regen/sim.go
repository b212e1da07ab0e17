package main

import (
	"fmt"
	"net"
	"strconv"

	"github.com/regen-dev/regen/internal/sim"
	"github.com/spf13/cobra"
)

func init() { addCommand(newSimCommand) }

// simOptions are the flags of `regen sim`.
type simOptions struct {
	host string
	port int
	cfg  sim.Config
	// SGLang/vLLM arguments accepted so a launch script can pass its
	// command line unchanged; they have no effect on the simulation.
	ignoredBool   [6]bool
	ignoredString [8]string
}

func (o *simOptions) AddFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&o.host, "host", "127.0.0.1", "address to listen on")
	fs.IntVar(&o.port, "port", 30000, "port to listen on (0 = any free port)")
	sim.RegisterFlags(fs, &o.cfg)
	for i, name := range []string{"trust-remote-code", "enable-metrics", "enable-cache-report", "disable-cuda-graph", "disable-radix-cache", "enable-mixed-chunk"} {
		fs.BoolVar(&o.ignoredBool[i], name, false, "accepted for SGLang compatibility; no effect")
	}
	for i, name := range []string{"reasoning-parser", "tool-call-parser", "kv-cache-dtype", "log-level", "attention-backend", "tokenizer-path", "dtype", "quantization"} {
		fs.StringVar(&o.ignoredString[i], name, "", "accepted for SGLang compatibility; no effect")
	}
	fs.IntVar(&o.cfg.TP, "tp-size", o.cfg.TP, "alias of --tp (echoed)")
	fs.IntVar(new(int), "page-size", 0, "accepted for SGLang compatibility; no effect")
	fs.IntVar(new(int), "cuda-graph-max-bs", 0, "accepted for SGLang compatibility; no effect")
}

func newSimCommand() *cobra.Command {
	o := &simOptions{cfg: sim.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "sim [flags]",
		Short: "Run the built-in simulated SGLang (or vLLM, or llama-server) server",
		Long: `Run an OpenAI-compatible server that behaves like SGLang where regen's
decisions depend on it: a KV token pool with continuous batching and
retraction, SGLang's endpoints (/v1/chat/completions, /v1/completions,
/v1/models, /health, /health_generate, /server_info, /get_server_info,
/v1/loads, /metrics), its log lines on stderr, and injectable faults.
Durations are simulated time, run --speed times faster than real time.

--engine vllm serves vLLM's routes and metric names (/version, /load,
max_model_len); --engine llamacpp serves llama-server's: --parallel slots
sharing --context-length (each slot its share; a prompt that does not fit
one is refused, an answer stops when its slot is full), /props, /slots,
owned_by llamacpp and the Server: llama.cpp header. --api-shape previous
serves the routes and names of the releases before today's (SGLang
/get_server_info only, vLLM gpu_cache_usage_perc); --dp N presents an
SGLang pool as N data-parallel ranks.

--engine vllm --hidden-states DIR --hidden-size N --layers L writes each
(unstreamed) /v1/completions request's hidden states to
DIR/cmpl-<id>-0.safetensors, held under DIR/cmpl-<id>-0.safetensors.lock
while written, and names the file in kv_transfer_params.hidden_states_path,
as vLLM's extract_hidden_states method with its hidden-states connector
does; --hidden-states-fault injects nan, inf, wrong-ids, missing,
truncated, slow or wrong-prompt-ids. vLLM's /v1/chat/completions/render
answers a chat request's prompt ids (--render-skew TEXT: one id off).

Faults come from the flags below or from --scenario, a YAML list such as:

  - {kind: crash, after_requests: 500, error: oom, exit_code: 3}
  - {kind: hang, at: 60s, for: 30s}
  - {kind: error, after_requests: 10, count: 5, status: 503}
  - {kind: reset, count: 2, tokens: 10}
  - {kind: malformed, count: 1, tokens: 3}
  - {kind: slow, at: 10s, factor: 4, for: 20s}
  - {kind: zombie, after_requests: 100}
  - {kind: crash, kv_above: 0.95, kv_for: 30s}
  - {kind: cut, prompt: "row 17", tokens: 3}     # every time, others answered
  - {kind: throttle, at: 10s, for: 25s, retry_after: 2}   # 429 + Retry-After
  - {kind: throttle, probability: 0.2, status: 503}       # for ever, 1 in 5

Unknown SGLang arguments are accepted and ignored, so a launch script can
pass SGLang's command line; --max-running-requests, --served-model-name,
--model-path, --context-length, --max-total-tokens and --watchdog-timeout
take effect. The server runs until SIGINT/SIGTERM and exits with the
fault's code when a crash fault fires.`,
		Args:               cobra.ArbitraryArgs,
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
		RunE: func(cmd *cobra.Command, args []string) error {
			// vLLM style: `vllm serve MODEL` passes the model positionally.
			if len(args) > 0 && !cmd.Flags().Changed("model-path") {
				o.cfg.ModelPath = args[len(args)-1]
			}
			return runSim(cmd, o)
		},
	}
	o.AddFlags(cmd)
	return cmd
}

// runSim serves until the context ends or a crash fault fires.
func runSim(cmd *cobra.Command, o *simOptions) error {
	ctx := cmd.Context()
	s, err := sim.New(o.cfg, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer s.Close()
	url, err := s.Start(ctx, net.JoinHostPort(o.host, strconv.Itoa(o.port)))
	if err != nil {
		return err
	}
	fmt.Fprintln(cmd.OutOrStdout(), url)
	select {
	case <-ctx.Done():
		return nil
	case code := <-s.Crashed():
		return &exitError{code: code}
	}
}
