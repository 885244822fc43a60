"""The --dp-size front's pure pieces: core shares, metric merging, the data_parallel_rank field, flag checks."""

from __future__ import annotations

import os

import pytest

from impl.args.server_args import ServerArgs
from impl.server.dp_control import core_shares, validate_dp_args
from impl.server.dp_relay import _body_object, _requested_rank, merge_metrics
from impl.server.errors import APIError


def test_core_shares_split_the_allowed_cores():
    cores = sorted(os.sched_getaffinity(0))
    shares = core_shares(len(cores))
    assert [list(s) for s in shares] == [[c] for c in cores]
    one = core_shares(1)
    assert list(one[0]) == cores
    many = core_shares(len(cores) + 1)  # more ranks than cores: ranks share, one core each
    assert all(len(s) == 1 for s in many) and many[-1] == (cores[0],)


def _text(prompt: int, usage: float, running: int) -> str:
    return "\n".join([
        "# HELP sglang:prompt_tokens_total Prompt tokens.",
        "# TYPE sglang:prompt_tokens_total counter",
        f'sglang:prompt_tokens_total{{model_name="m"}} {prompt}',
        f'sglang:e2e_request_latency_seconds_bucket{{model_name="m",le="+Inf"}} {prompt // 4}',
        "# TYPE sglang:token_usage gauge",
        f'sglang:token_usage{{model_name="m"}} {usage}',
        f'sglang:num_running_reqs{{model_name="m"}} {running}',
    ]) + "\n"


def test_merge_metrics_sums_counts_and_averages_ratios():
    merged = merge_metrics([_text(8, 0.5, 1), _text(4, 0.25, 2)])
    lines = merged.splitlines()
    assert lines[0] == "# HELP sglang:prompt_tokens_total Prompt tokens."
    assert 'sglang:prompt_tokens_total{model_name="m"} 12' in lines
    assert 'sglang:e2e_request_latency_seconds_bucket{model_name="m",le="+Inf"} 3' in lines
    assert 'sglang:token_usage{model_name="m"} 0.375' in lines
    assert 'sglang:num_running_reqs{model_name="m"} 3' in lines
    assert sum(line.startswith("# HELP") for line in lines) == 1  # comments once, from the first rank
    assert merge_metrics([]) == ""


def test_requested_rank_validates_the_field():
    def rank(body: bytes):
        return _requested_rank(_body_object(body), 2)

    assert rank(b'{"text": "hi"}') is None
    assert rank(b'{"text": "hi", "data_parallel_rank": 1}') == 1
    assert rank(b"not json") is None and rank(b"[1]") is None  # the replica names the error
    for bad in (b'{"data_parallel_rank": 2}', b'{"data_parallel_rank": -1}', b'{"data_parallel_rank": "0"}',
                b'{"data_parallel_rank": true}'):
        with pytest.raises(APIError) as e:
            rank(bad)
        assert e.value.status == 400 and "data_parallel_rank" in e.value.message and "[0, 1]" in e.value.message


def test_dp_flags():
    args = ServerArgs.parse(["--dp-size", "3", "--load-balance-method", "shortest_queue", "--timeout-keep-alive", "30"])
    assert (args.dp_size, args.load_balance_method, args.timeout_keep_alive) == (3, "shortest_queue", 30)
    assert ServerArgs().timeout_keep_alive > 90  # outlives sglang-router's 90 s pool idle timeout
    with pytest.raises(ValueError, match="--dp-size must be a positive"):
        validate_dp_args(ServerArgs(dp_size=0))
    with pytest.raises(SystemExit):
        ServerArgs.parse(["--load-balance-method", "minimum_tokens"])


def test_engine_refuses_dp_size():
    from impl.engine.engine import Engine

    with pytest.raises(ValueError, match="--dp-size 2: an Engine is one replica"):
        Engine(dp_size=2)


def test_start_router_retries_a_port_taken_before_it_bound(monkeypatch):
    """A free_port() pick can be taken by another process's outgoing connection before the router binds it:
    start_router starts it again on fresh ports; any other failure is raised at once."""
    from impl import launch_cluster as lc

    started, stopped = [], []

    class FakeChild:
        def __init__(self, argv):
            self.argv = argv

        def stop(self):
            stopped.append(self)

    def fake_spawn(name, argv, out, cores=None):
        started.append(FakeChild(argv))
        return started[-1]

    outcomes = iter(["Error starting router: Address already in use (os error 98)", None])

    def fake_wait(url, child, n, deadline, api_key=None):
        msg = next(outcomes)
        if msg:
            raise RuntimeError(f"the router exited with 1:\n{msg}")

    monkeypatch.setattr(lc, "spawn", fake_spawn)
    monkeypatch.setattr(lc, "wait_router", fake_wait)
    child, url = lc.start_router("r", ["http://w"], "127.0.0.1", "round_robin", [], None, 0.0, 1)
    assert child is started[1] and stopped == [started[0]] and url.startswith("http://127.0.0.1:")
    assert started[0].argv != started[1].argv  # fresh ports on the second attempt

    outcomes = iter(["the router at http://x did not list 1 healthy workers in time"])
    with pytest.raises(RuntimeError, match="did not list 1 healthy workers"):
        lc.start_router("r", ["http://w"], "127.0.0.1", "round_robin", [], None, 0.0, 1)
