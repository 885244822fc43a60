"""The http subject's Prometheus reader (``contracts.http_dialect``) on the text vLLM and SGLang serve.

vLLM's ``vllm:cache_config_info`` carries every CacheConfig field as a label, some with commas, spaces or
brackets in their values; HTTP-SERVER-INFO-FLAG reads the resolved ``kv_sharing_fast_prefill`` there.
"""

from __future__ import annotations

from contracts.http_dialect import parse_sample, total

VLLM_TEXT = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",kv_sharing_fast_prefill="True",mamba_block_size="[16, 32]",prefix="a \\"b\\", c"} 1.0
vllm:num_requests_running{engine="0",model_name="peer"} 0.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="peer"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="peer"} 5.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="peer"} 7.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="peer"} 7.0
sglang:num_running_reqs 3
"""


def _samples():
    return [s for s in map(parse_sample, VLLM_TEXT.splitlines()) if s is not None]


def test_labels_with_commas_quotes_and_spaces_parse_whole():
    name, labels, value = _samples()[0]
    assert name == "vllm:cache_config_info" and value == 1.0
    assert labels == {"block_size": "16", "cache_dtype": "auto", "kv_sharing_fast_prefill": "True",
                      "mamba_block_size": "[16, 32]", "prefix": 'a "b", c'}


def test_totals_filter_by_label_and_skip_buckets():
    samples = _samples()
    assert len(samples) == 7  # comments dropped
    assert total(samples, "vllm:request_success_total") == 7.0
    assert total(samples, "vllm:request_success_total", finished_reason="abort") == 2.0
    assert total(samples, "vllm:time_to_first_token_seconds_bucket") is None  # only buckets: not a total
    assert total(samples, "vllm:time_to_first_token_seconds_count") == 7.0
    assert total(samples, "sglang:num_running_reqs") == 3.0
    assert total(samples, "vllm:no_such_metric") is None


def test_unparsable_lines_are_dropped():
    assert parse_sample('x{a="1"') is None
    assert parse_sample("x{a=1} 2") is None
    assert parse_sample("x NaN") is not None and parse_sample("x not-a-number") is None
