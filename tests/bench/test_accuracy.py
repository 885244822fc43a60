"""The accuracy yardstick (bench/accuracy.py): its figures on small deterministic data, and one real run."""

from __future__ import annotations

import math

import pytest

from bench.accuracy import common_prefix, dense, kl_divergence, measure
from bench.accuracy_settings import COMMON, SETTINGS, Setting


def test_common_prefix_counts_tokens_up_to_the_first_difference():
    assert common_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert common_prefix([1, 2], [1, 2]) == 2
    assert common_prefix([5], [6]) == 0


def test_kl_is_zero_on_equal_distributions_and_matches_the_closed_form():
    p = [math.log(0.5), math.log(0.25), math.log(0.25)]
    q = [math.log(0.25), math.log(0.5), math.log(0.25)]
    assert kl_divergence(p, p) == 0.0
    assert kl_divergence(p, q) == pytest.approx(0.5 * math.log(2) + 0.25 * math.log(0.5))
    assert kl_divergence([0.0, -math.inf], [math.log(0.9), math.log(0.1)]) == pytest.approx(-math.log(0.9))


def test_a_truncated_top_list_is_refused_rather_than_giving_a_smaller_kl():
    assert dense([(-0.1, 1, None), (-2.4, 0, None)], 2) == [-2.4, -0.1]
    with pytest.raises(ValueError, match="truncated"):
        dense([(-0.1, 1, None)], 2)


def test_a_setting_is_server_args_on_both_sides():
    s = SETTINGS["kv-fp8_e4m3"]
    assert s.argv("reference", "/m") == ["--model-path", "/m", *COMMON, "--dtype", "float32", "--kv-cache-dtype", "bf16"]
    assert s.argv("candidate", "/m")[-1] == "fp8_e4m3"


def test_yardstick_on_the_tiny_model_aligns_the_teacher_forced_path_and_sees_fp8():
    """The reference's teacher-forced top-1 is its own greedy token at every position (the distributions line up
    with the path), and e5m2 KV on the random e2b has a KL above zero."""
    from impl.checkpoint_factory.checkpoints import tiny_checkpoint

    path = tiny_checkpoint("e2b")
    prompts = [[2, 17, 40, 99, 3 + i] for i in range(3)]
    engines: dict = {}
    try:
        r = measure(Setting("t", ("--kv-cache-dtype", "bf16"), ("--kv-cache-dtype", "fp8_e5m2"), "test"), path,
                    prompts, 6, engines, {}, log=lambda *_: None)
    finally:
        for e in engines.values():
            e.shutdown()
    assert r.reference_tf_top1 == 1.0
    assert r.mean_kl > 0.0 and r.max_kl >= r.mean_kl
    assert 0 <= r.mean_prefix <= 6 and r.prompts == 3
