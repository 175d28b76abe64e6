"""The /load document: what a runtime writes, a gateway reads back; anything else is refused, not guessed at."""
import pytest

from sluice_contracts.load_report import LoadReport, PrefixCacheStats

CORE = '"waiting": 1, "running": 2, "kv_cache_usage": 0.25'


def test_a_full_report_reads_back_as_written():
    report = LoadReport(waiting=3, running=2, kv_cache_usage=0.5, model="smollm2", block_size=16, num_kv_blocks=64,
                        prefix_cache=PrefixCacheStats.of(queries=8, hits=2), in_flight=2, draining=False)
    assert LoadReport.model_validate_json(report.model_dump_json()) == report
    assert report.prefix_cache.hit_rate == 0.25


def test_no_queries_is_a_zero_hit_rate_not_a_division_error():
    assert PrefixCacheStats.of(queries=0, hits=0).hit_rate == 0.0


def test_the_three_load_figures_are_enough_and_unknown_fields_are_ignored():
    report = LoadReport.model_validate_json('{%s, "added_in_a_later_release": {"x": 1}}' % CORE)
    assert (report.waiting, report.running, report.kv_cache_usage) == (1, 2, 0.25)
    assert report.block_size is None and report.draining is None


@pytest.mark.parametrize("body", [
    '{"running": 2, "kv_cache_usage": 0.25}',  # a load figure missing
    '{"waiting": "1", "running": 2, "kv_cache_usage": 0.25}',  # a count as text
    '{"waiting": true, "running": 2, "kv_cache_usage": 0.25}',  # a boolean for a count
    '{"waiting": 1.5, "running": 2, "kv_cache_usage": 0.25}',
    '{"waiting": -1, "running": 2, "kv_cache_usage": 0.25}',
    '{"waiting": null, "running": 2, "kv_cache_usage": 0.25}',
    '{"waiting": 1, "running": 2, "kv_cache_usage": NaN}',
    '{"waiting": 1, "running": 2, "kv_cache_usage": 1e999}',
    '{"waiting": 1, "running": 2, "kv_cache_usage": 1.5}',
    '{"waiting": 1, "running": 2, "kv_cache_usage": "0.2"}',
    '{%s, "block_size": 0}' % CORE,
    '{%s, "draining": "no"}' % CORE,
    '{%s, "prefix_cache": {"queries": 1, "hits": 1, "hit_rate": 2}}' % CORE,
    '[1, 2, 0.25]', '"busy"', '', '{"waiting": 1',
])
def test_anything_else_is_a_value_error(body):
    with pytest.raises(ValueError):
        LoadReport.model_validate_json(body)


def test_loaded_adapters_read_back_and_odd_lists_are_refused():
    report = LoadReport.model_validate_json('{%s, "loaded_adapters": ["sql-v1", "tone"]}' % CORE)
    assert report.loaded_adapters == ("sql-v1", "tone")
    assert LoadReport.model_validate_json('{%s}' % CORE).loaded_adapters is None
    too_many = ", ".join(f'"a{i}"' for i in range(257))
    for odd in ('"sql-v1"', '[1]', '[""]', '[null]', '{"sql-v1": true}', f'[{too_many}]'):
        with pytest.raises(ValueError):
            LoadReport.model_validate_json('{%s, "loaded_adapters": %s}' % (CORE, odd))
