// Package plan sizes an inference server's memory before it is launched:
// weights per GPU rank, KV-cache bytes per token, the engine's predicted
// token capacity (SGLang max_total_num_tokens or vLLM's GPU KV cache size),
// the host memory a hierarchical cache takes on every rank, a recommended
// concurrency per lane, and launch flags ready to paste into a job.
//
// Everything here is a pure function over typed inputs. The only I/O is the
// explicit loaders LoadModelConfig (a Hugging Face config.json) and
// LoadSafetensorsIndex (a model.safetensors.index.json). Compute never
// prints or logs; callers render a Plan with WriteText or encode it as JSON.
//
// The formulas follow docs/engines.md §1 (SGLang KV capacity), §2 (HiCache
// host pool, sized per TP rank), §6 (vLLM memory and blocks) and §8
// (Kimi-K2.5, RTX PRO 6000), each fact there with its public source. Every number that is not read from the user's input or the
// config file is marked as an estimate in Plan.Estimates and in the text
// table, because the engine measures the real values at startup and the
// driver should trust the server's own report over this prediction.
//
// When a plan cannot work, Compute still returns the Plan (so the arithmetic
// can be shown) together with a *RefusalError that lists every refusal with
// its arithmetic as text lines; callers branch on it with errors.As.
package plan
