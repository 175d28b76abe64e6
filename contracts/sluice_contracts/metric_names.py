"""The runtime's Prometheus metric names, which the operator's autoscaler scrapes.

They are vLLM's names with its `model_name` label, so dashboards, KEDA rules and the Gateway API Inference
Extension written for vLLM read a Sluice runtime unchanged. Counter names are given as their family name:
Prometheus exposes each counter's sample with `_total` appended.
"""
from __future__ import annotations

MODEL_LABEL = "model_name"

# Gauges, read at scrape time from the engine.
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # 0-1, despite the name
# The same gauge under vLLM's name before its V1 engine: the default of the Gateway API Inference Extension's
# endpoint picker (v1.2.0, --kv-cache-usage-percentage-metric), so a GIE gateway reads a Sluice runtime unchanged.
GPU_CACHE_USAGE = "vllm:gpu_cache_usage_perc"
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # labels block_size and num_gpu_blocks, value 1
# Labels below (adapter names comma-separated, and the resident limit); value: the scrape's Unix time, as vLLM.
LORA_REQUESTS_INFO = "vllm:lora_requests_info"
LORA_RUNNING_LABEL = "running_lora_adapters"
LORA_WAITING_LABEL = "waiting_lora_adapters"
LORA_MAX_LABEL = "max_lora"

# Counters (exposed as NAME_total).
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
NUM_PREEMPTIONS = "vllm:num_preemptions"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"  # label finished_reason
# Speculative decoding: verifications run, draft tokens proposed, draft tokens accepted.
SPEC_DECODE_NUM_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DECODE_NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # label position
POSITION_LABEL = "position"

# Histograms.
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME = "vllm:request_queue_time_seconds"
REQUEST_PREFILL_TIME = "vllm:request_prefill_time_seconds"
REQUEST_DECODE_TIME = "vllm:request_decode_time_seconds"
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"

# Sluice's own, by priority (label PRIORITY_LABEL: the number of sluice_contracts.request_priority).
PRIORITY_LABEL = "priority"
REQUESTS_WAITING_BY_PRIORITY = "sluice_runtime_requests_waiting_by_priority"  # gauge: accepted, not started yet
REQUESTS_SHED = "sluice_runtime_requests_shed"  # counter: refused for a full queue, or dropped from it

# Requests refused at once or ended before they started, by reason (label REFUSAL_REASON_LABEL): their answer was
# not expected within their budget; the queue was full (refused, or shed for a more urgent one); their budget
# passed while they were queued (sluice_contracts.request_deadline).
REQUESTS_REFUSED = "sluice_runtime_requests_refused"  # counter
REFUSAL_REASON_LABEL = "reason"
REFUSAL_DEADLINE = "deadline"
REFUSAL_QUEUE_FULL = "queue_full"
REFUSAL_BUDGET_PASSED = "budget_passed"
# Counter: steps of batch-class rows only abandoned between layers for a more urgent request that arrived.
STEPS_INTERRUPTED = "sluice_runtime_steps_interrupted"
# Gauge: seconds before a request of the default priority arriving now would start, as the runtime estimates it.
ESTIMATED_QUEUE_SECONDS = "sluice_runtime_estimated_queue_seconds"
