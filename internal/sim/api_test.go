package sim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func TestOpenAIClientStreams(t *testing.T) {
	c := testConfig()
	_, url, _ := startServer(t, c)
	client := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("none"), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:         "m",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something.")},
		MaxTokens:     openai.Int(64),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" {
		t.Fatalf("accumulated %+v; want one choice with content", acc.Choices)
	}
	// A stopped answer's count includes the stop token, which has no text.
	words := len(strings.Fields(acc.Choices[0].Message.Content))
	if acc.Choices[0].FinishReason == "stop" {
		words++
	}
	if acc.Usage.CompletionTokens != int64(words) {
		t.Errorf("usage completion_tokens = %d, content and stop token make %d tokens", acc.Usage.CompletionTokens, words)
	}
	if fr := acc.Choices[0].FinishReason; fr != "stop" && fr != "length" {
		t.Errorf("finish_reason = %q, want stop or length", fr)
	}
}

func TestStreamShapes(t *testing.T) {
	c := testConfig()
	c.ToolCallFraction = 1
	_, url, _ := startServer(t, c)
	tests := []struct {
		name                     string
		extra                    string
		wantReasoning, wantTools bool
	}{
		{"plain", "", false, false},
		{"thinking", `,"chat_template_kwargs":{"thinking":true}`, true, false},
		{"enable_thinking", `,"chat_template_kwargs":{"enable_thinking":true}`, true, false},
		{"tools", `,"tools":[{"type":"function","function":{"name":"lookup","parameters":{}}}]`, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := streamChat(http.DefaultClient, url, chatBody("shape "+tt.name, 2000, tt.extra))
			if !r.done || r.err != nil || !r.roleAssigned {
				t.Fatalf("stream: done=%v err=%v role=%v", r.done, r.err, r.roleAssigned)
			}
			if got := r.reasoning != ""; got != tt.wantReasoning {
				t.Errorf("reasoning_content present = %v, want %v", got, tt.wantReasoning)
			}
			if got := r.toolName == "lookup"; got != tt.wantTools {
				t.Errorf("tool call to lookup = %v (name %q), want %v", got, r.toolName, tt.wantTools)
			}
			if tt.wantTools {
				var args map[string]string
				if err := json.Unmarshal([]byte(r.toolArgs), &args); err != nil {
					t.Errorf("tool arguments %q are not JSON: %v", r.toolArgs, err)
				}
				if r.finish != "tool_calls" && r.finish != "length" {
					t.Errorf("finish_reason = %q, want tool_calls", r.finish)
				}
			}
			toks := len(strings.Fields(r.content)) + len(strings.Fields(r.reasoning))
			if r.toolArgs != "" {
				toks += len(strings.Fields(r.toolArgs)) - 1 // `{"text":` is part of the first token
			}
			if r.finish == "stop" || r.finish == "tool_calls" {
				toks++ // the stop token, counted and without text
			}
			if r.usage == nil || r.usage.CompletionTokens != toks {
				t.Errorf("usage %+v; want completion_tokens %d", r.usage, toks)
			}
		})
	}
}

func TestTruncationAndDeterminism(t *testing.T) {
	c := testConfig()
	c.TruncateFraction = 1
	_, url, _ := startServer(t, c)
	a := streamChat(http.DefaultClient, url, chatBody("same", 17, ""))
	b := streamChat(http.DefaultClient, url, chatBody("same", 17, ""))
	if a.finish != "length" || a.usage.CompletionTokens != 17 {
		t.Errorf("finish %q, %d tokens; want length at max_tokens 17", a.finish, a.usage.CompletionTokens)
	}
	if a.content != b.content {
		t.Errorf("same request gave different content:\n%q\n%q", a.content, b.content)
	}
	if b.usage.PromptTokensDetails.CachedTokens == 0 {
		t.Errorf("repeated prompt had no cached tokens; want a prefix-cache hit")
	}
}

func TestNonStreamingAndCompletions(t *testing.T) {
	_, url, _ := startServer(t, testConfig())
	for _, tt := range []struct{ path, body, object string }{
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9}`, "chat.completion"},
		{"/v1/completions", `{"model":"m","prompt":"Once upon a time","max_tokens":9}`, "text_completion"},
	} {
		resp, err := http.Post(url+tt.path, "application/json", strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Object string `json:"object"`
			Usage  usage  `json:"usage"`
		}
		json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if resp.StatusCode != 200 || out.Object != tt.object || out.Usage.CompletionTokens < 1 || out.Usage.CompletionTokens > 9 {
			t.Errorf("%s: status %d, %+v; want 200 %s with 1..9 tokens", tt.path, resp.StatusCode, out, tt.object)
		}
	}
	resp, _ := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":300000}`))
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("max_tokens beyond the context: status %d, want 400", resp.StatusCode)
	}
}

func TestMetricsNames(t *testing.T) {
	tests := []struct {
		engine string
		want   []string
	}{
		{"sglang", []string{"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens", "sglang:token_usage",
			"sglang:gen_throughput", "sglang:cache_hit_rate", "sglang:max_total_num_tokens", "sglang:prompt_tokens_total",
			"sglang:generation_tokens_total", "sglang:cached_tokens_total", "sglang:num_requests_total",
			"sglang:num_retracted_requests_total", "sglang:num_aborted_requests_total", "sglang:time_to_first_token_seconds"}},
		{"vllm", []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
			"vllm:num_preemptions_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:request_success_total"}},
	}
	for _, tt := range tests {
		t.Run(tt.engine, func(t *testing.T) {
			c := testConfig()
			c.Engine = tt.engine
			_, url, _ := startServer(t, c)
			r := streamChat(http.DefaultClient, url, chatBody("count me", 30, ""))
			m := scrape(t, url)
			for _, name := range tt.want {
				if _, ok := m[name]; !ok {
					t.Errorf("/metrics lacks %s", name)
				}
			}
			gen := m[tt.engine+":generation_tokens_total"]
			if int(gen) != r.usage.CompletionTokens {
				t.Errorf("generation_tokens_total = %v, want %d", gen, r.usage.CompletionTokens)
			}
		})
	}
}

func TestMetricLabels(t *testing.T) {
	_, url, _ := startServer(t, testConfig())
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := new(strings.Builder)
	_, _ = io.Copy(buf, resp.Body)
	want := `sglang:max_total_num_tokens{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 231120`
	if !strings.Contains(buf.String(), want) {
		t.Errorf("/metrics lacks %s", want)
	}
}

func TestServerInfo(t *testing.T) {
	c := testConfig()
	c.KVTokens = 5000
	c.MaxRunningRequests = 7
	_, url, _ := startServer(t, c)
	resp, err := http.Get(url + "/get_server_info")
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		MaxTotalNumTokens  int              `json:"max_total_num_tokens"`
		MaxRunningRequests int              `json:"max_running_requests"`
		InternalStates     []map[string]any `json:"internal_states"`
	}
	json.NewDecoder(resp.Body).Decode(&info)
	resp.Body.Close()
	got := []int{info.MaxTotalNumTokens, info.MaxRunningRequests, len(info.InternalStates)}
	if diff := cmp.Diff([]int{5000, 7, 1}, got); diff != "" {
		t.Errorf("server info (-want +got):\n%s", diff)
	}
}

func TestApply(t *testing.T) {
	c := DefaultConfig()
	err := c.Apply(map[string]any{"kv_tokens": uint64(5000), "speed": 10, "load_time": 3, "health_timeout": "5s",
		"served_model_name": "kimi", "crash_after_requests": 100, "engine": "vllm"})
	if err != nil {
		t.Fatal(err)
	}
	got := []any{c.KVTokens, c.Speed, c.LoadTime, c.HealthTimeout, c.ModelName, c.CrashAfterRequests, c.Engine}
	want := []any{5000, 10.0, 3 * time.Second, 5 * time.Second, "kimi", 100, "vllm"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Apply (-want +got):\n%s", diff)
	}
	for _, bad := range []map[string]any{{"kv_tokenz": 1}, {"speed": "fast"}, {"load_time": []int{1}}} {
		if err := c.Apply(bad); err == nil {
			t.Errorf("Apply(%v) = nil error, want one", bad)
		}
	}
}

// TestSeedVariesAnswer: the seed parameter gives another answer to the same
// prompt, the same seed the same answer, and the prompt stays cached.
func TestSeedVariesAnswer(t *testing.T) {
	_, url, _ := startServer(t, testConfig())
	ask := func(extra string) streamResult {
		return streamChat(http.DefaultClient, url, chatBody("same prompt", 40, extra))
	}
	none, s1, s2, s1again := ask(""), ask(`,"seed":1`), ask(`,"seed":2`), ask(`,"seed":1`)
	for _, r := range []streamResult{none, s1, s2, s1again} {
		if r.content == "" {
			t.Fatalf("empty answer: %+v", r)
		}
	}
	if s1.content == s2.content || s1.content == none.content {
		t.Errorf("seeds 1, 2 and none gave the same content; want three answers:\n%q\n%q\n%q", none.content, s1.content, s2.content)
	}
	if s1.content != s1again.content {
		t.Errorf("seed 1 twice gave different content:\n%q\n%q", s1.content, s1again.content)
	}
	if s2.usage.PromptTokensDetails.CachedTokens == 0 {
		t.Errorf("the prompt asked again with another seed had no cached tokens; want a prefix-cache hit")
	}
}
