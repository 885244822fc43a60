"""``Contract.run``'s verdicts (``contracts.base``): every failing case collected, a refusal judged by the options
the rule is about, a crashing server a failure, and a partial pass noted. No subject is started."""

from __future__ import annotations

import httpx
import pytest

from contracts.base import (
    CommandLineRefused,
    Contract,
    ContractViolation,
    Inconclusive,
    OutOfScope,
    case,
    collect_notes,
    inconclusive,
    require,
)


def _contract(check, options=("--flag",)) -> Contract:
    return Contract("TEST-TAXONOMY", "a rule", "here", ("F1",), frozenset({"args"}), check, options=options)


def test_every_failing_case_is_collected():
    def check(subject) -> None:
        for i in range(4):
            with case(f"case {i}"):
                require(i % 2 == 0, f"case {i} broke the rule")

    with pytest.raises(ContractViolation, match=r"2 of 4 cases failed: case 1 broke the rule \| case 3 broke"):
        _contract(check).run(None)


def test_refusal_of_the_option_the_rule_is_about_is_out_of_scope():
    def check(subject) -> None:
        raise CommandLineRefused(["--flag"], "serve: error: unrecognized arguments: --flag")

    with pytest.raises(OutOfScope, match="has no --flag, which this rule is about") as e:
        _contract(check).run(None)
    assert e.value.options == ("--flag",)


def test_refusal_of_another_option_is_inconclusive():
    def lacking(subject) -> None:
        raise CommandLineRefused(["--other"], "serve: error: unrecognized arguments: --other")

    def bad_value(subject) -> None:
        raise CommandLineRefused(["--other", "x"], "serve: error: argument --other: invalid choice: 'x'")

    for check in (lacking, bad_value):
        with pytest.raises(Inconclusive, match="which this rule is not about"):
            _contract(check).run(None)


def test_refused_value_of_the_option_the_rule_is_about_fails():
    def check(subject) -> None:
        raise CommandLineRefused(["--flag", "x"], "serve: error: argument --flag: invalid choice: 'x'")

    with pytest.raises(ContractViolation, match="command line refused it"):
        _contract(check).run(None)


def test_a_crashing_server_fails_the_contract():
    def check(subject) -> None:
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

    with pytest.raises(ContractViolation, match="stopped answering"):
        _contract(check, options=()).run(None)


def test_partial_pass_and_failures_outweigh_skips():
    def partial(subject) -> None:
        with case("judged"):
            pass
        with case("noisy"):
            raise inconclusive("noise")

    with collect_notes() as notes:
        _contract(partial).run(None)
    assert notes and notes[0].startswith("partial: 1 of 2 cases judged")

    def failed(subject) -> None:
        with case("noisy"):
            raise inconclusive("noise")
        require(False, "the last case broke it")

    with pytest.raises(ContractViolation, match="the last case broke it"):
        _contract(failed).run(None)

    def none_judged(subject) -> None:
        with case("noisy"):
            raise inconclusive("noise")

    with pytest.raises(Inconclusive, match="noisy"):
        _contract(none_judged).run(None)


def test_a_throughput_pass_notes_its_figures_and_a_split_wall_clock_is_inconclusive():
    from contracts.throughput import Pairs, _judge

    def judge(pairs: list[Pairs]) -> list[str]:
        with collect_notes() as notes:
            _judge(lambda: pairs.pop(0), lambda p: p.ratio >= 1.2, lambda p: f"median {p.ratio:.2f}", "required: 1.2")
        return notes

    good = Pairs("TTFT (s)", [2.0, 2.0, 2.0], [1.0, 1.0, 1.0], "wall")
    bad = Pairs("TTFT (s)", [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], "wall")
    assert judge([good]) == [f"{good.show()} (required: 1.2)"]
    assert judge([bad, good])[0].startswith(f"attempt 2: {good.show()} (required: 1.2); attempt 1: {bad.show()}")
    split = Pairs("TTFT (s)", [2.0, 1.0, 1.0], [1.0, 1.0, 1.0], "wall")
    pairs = [bad, split]
    check = _contract(lambda subject: _judge(lambda: pairs.pop(0), lambda p: p.ratio >= 1.2, str, "required: 1.2"))
    with pytest.raises(Inconclusive, match="1 of 3 pairs pass"):
        check.run(None)
