"""Reading the three load gauges of each engine from Prometheus text, as the gateway and the autoscaler do.

The vLLM and SGLang samples use the names and label their servers expose (sluice_contracts/engines.py cites
where they were read); the Sluice sample is the runtime's own capture (tests/operator/data/runtime_metrics.txt).
"""
from pathlib import Path

import pytest

from sluice_contracts.engines import LOAD_GAUGES, MetricsParseError, parse_load

CAPTURE = (Path(__file__).parents[1] / "operator" / "data" / "runtime_metrics.txt").read_text()

VLLM_V0 = """# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="chat"} 3.0
vllm:num_requests_waiting{model_name="chat"} 5.0
vllm:gpu_cache_usage_perc{model_name="chat"} 0.25
"""
SGLANG = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="chat",engine_type="unified",tp_rank="0",dp_rank="0"} 7.0
sglang:num_running_reqs{model_name="chat",engine_type="unified",tp_rank="0",dp_rank="1"} 1.0
sglang:num_queue_reqs{model_name="chat",engine_type="unified",tp_rank="0",dp_rank="0"} 2.0
sglang:num_queue_reqs{model_name="chat",engine_type="unified",tp_rank="0",dp_rank="1"} 0.0
sglang:token_usage{model_name="chat",engine_type="unified",tp_rank="0",dp_rank="0"} 0.5
sglang:token_usage{model_name="chat",engine_type="unified",tp_rank="0",dp_rank="1"} 0.1
"""


def test_sluice_and_vllm_read_the_same_vllm_names_from_the_runtime():
    for engine in ("sluice", "vllm"):
        load = parse_load(CAPTURE, engine, "smollm2")
        assert load.running == 3 and load.waiting == 0 and 0 < load.kv_cache_usage < 1


def test_vllm_before_v1_names_its_kv_gauge_gpu_cache_usage_perc():
    load = parse_load(VLLM_V0, "vllm", "chat")
    assert (load.running, load.waiting, load.kv_cache_usage) == (3, 5, 0.25)
    with pytest.raises(MetricsParseError, match="lacks vllm:kv_cache_usage_perc"):
        parse_load(VLLM_V0, "sluice", "chat")  # Sluice's runtime always had the new name


def test_sglang_has_its_own_names_summed_over_ranks():
    load = parse_load(SGLANG, "sglang", "chat")
    assert (load.running, load.waiting) == (8, 2) and load.kv_cache_usage == pytest.approx(0.6)
    with pytest.raises(MetricsParseError, match="lacks vllm:kv_cache_usage_perc"):
        parse_load(SGLANG, "vllm", "chat")


def test_another_models_samples_do_not_count():
    with pytest.raises(MetricsParseError, match=r"lacks sglang:token_usage, sglang:num_queue_reqs, "
                                                r"sglang:num_running_reqs for model 'other'"):
        parse_load(SGLANG, "sglang", "other")


def test_labels_with_quotes_commas_and_braces_are_read_whole():
    text = ('vllm:num_requests_running{model_name="chat",note="a \\"quoted\\", {braced} one"} 1\n'
            'vllm:num_requests_waiting{model_name="chat"} 2 1700000000000\n'
            'vllm:kv_cache_usage_perc{model_name="chat\\\\"} 0.9\n'
            'vllm:kv_cache_usage_perc{model_name="chat"} 0.4\n')
    load = parse_load(text, "vllm", "chat")
    assert (load.running, load.waiting, load.kv_cache_usage) == (1, 2, 0.4)


@pytest.mark.parametrize("text", [
    'vllm:num_requests_running{model_name="chat" 3\n',
    'vllm:num_requests_running{model_name=chat} 3\n',
    'vllm:num_requests_running{model_name="chat"} three\n',
    '<html>not metrics</html>\n',
    '{"waiting": 0, "running": 0}\n',
])
def test_what_is_not_prometheus_text_is_refused(text):
    with pytest.raises(MetricsParseError, match="unparsable"):
        parse_load(text, "vllm", "chat")


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_values_that_are_not_numbers_are_refused(value):
    text = CAPTURE.replace('vllm:num_requests_waiting{model_name="smollm2"} 0.0',
                           f'vllm:num_requests_waiting{{model_name="smollm2"}} {value}')
    assert text != CAPTURE
    with pytest.raises(MetricsParseError, match=f"reports {value.replace('+', '[+]')}"):
        parse_load(text, "sluice", "smollm2")


def test_every_engine_has_all_three_gauges():
    assert set(LOAD_GAUGES) == {"sluice", "vllm", "sglang"}
    for gauges in LOAD_GAUGES.values():
        assert gauges.running and gauges.waiting and gauges.kv_cache_usage
