"""make parity-full's verdicts (bench/parity_full.py) on small deterministic data."""

from __future__ import annotations

from bench.parity_full import NEW_TOKENS, Run, compare, passed, table


def _ref() -> tuple[Run, list[list[float]]]:
    first = [{0: -0.1, 1: -2.5, 2: -4.0}]
    return Run(first, [list(range(NEW_TOKENS))]), [[0.5] * NEW_TOKENS]


def test_within_tolerance_and_same_greedy_ids_pass():
    ref, gaps = _ref()
    ours = Run([{0: -0.1004, 1: -2.5003}], [list(range(NEW_TOKENS))])
    (row,) = compare("x", ref, gaps, ours, [[2, 9]], checked=True)
    assert abs(row.max_diff - 4e-4) < 1e-9 and row.same_top1 and row.prefix == NEW_TOKENS
    assert passed(row, 1e-3) and "| pass |" in table([row], 1e-3)


def test_a_logprob_off_by_more_than_the_tolerance_fails():
    ref, gaps = _ref()
    ours = Run([{0: -0.1, 1: -2.5025}], [list(range(NEW_TOKENS))])
    (row,) = compare("x", ref, gaps, ours, [[2, 9]], checked=True)
    assert not passed(row, 1e-3) and "FAIL" in table([row], 1e-3)


def test_a_greedy_divergence_fails_and_reports_where_and_the_reference_gap():
    ref, gaps = _ref()
    ids = list(range(NEW_TOKENS))
    ids[5] = 999
    (row,) = compare("x", ref, gaps, Run([{0: -0.1, 1: -2.5}], [ids]), [[2, 9]], checked=True)
    assert row.prefix == 5 and row.gap_at_divergence == 0.5 and not passed(row, 1e-3)


def test_bf16_rows_are_reported_not_judged():
    ref, gaps = _ref()
    (row,) = compare("bf16", ref, gaps, Run([{1: -0.1, 0: -2.5}], [[7] * NEW_TOKENS]), [[2, 9]], checked=False)
    assert not row.same_top1 and "| reported |" in table([row], 1e-3)
