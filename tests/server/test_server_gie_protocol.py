"""The runtime against the Gateway API Inference Extension's model-server protocol, the parts a CPU can check:
the metric names GIE's endpoint picker reads by default (v1.2.0, pkg/epp/server/runserver.go), their types and
labels (docs/proposals/003-model-server-protocol)."""
import httpx
from prometheus_client.parser import text_string_to_metric_families


def _families(url: str) -> dict:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_the_pickers_default_metrics_are_gauges_of_the_served_model(runtime_server):
    families = _families(runtime_server)
    for name in ("vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc",
                 "vllm:num_requests_running"):
        family = families[name]
        assert family.type == "gauge", (name, family.type)
        (sample,) = family.samples
        assert sample.labels.get("model_name") == "smollm2" and sample.value >= 0
    # KV-cache utilisation is a fraction under both names, and they agree.
    assert families["vllm:gpu_cache_usage_perc"].samples[0].value == families["vllm:kv_cache_usage_perc"].samples[0].value
    assert families["vllm:gpu_cache_usage_perc"].samples[0].value <= 1


def test_cache_config_info_gives_block_size_and_blocks(runtime_server):
    (sample,) = _families(runtime_server)["vllm:cache_config_info"].samples
    assert int(sample.labels["block_size"]) > 0 and int(sample.labels["num_gpu_blocks"]) > 0
