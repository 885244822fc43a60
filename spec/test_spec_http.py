"""HTTP with MTP (issue 15 item 7): the HTTP contracts against a server launched with NEXTN -> FROZEN_KV_MTP,
and the speculative fields a client sees (meta_info, /get_server_info, /metrics).

The MTP server prefills on torch_native (the triton kernels run interpreted on CPU-only machines; with
speculation every verify is an extend batch). H7 and H9 concern --kv-sharing-fast-prefill, which needs the
triton prefill backend; fast prefill with MTP is SPEC-FAST-PREFILL (in process).
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from contracts.base import get_contract
from contracts.http_support import ARGV_OFF
from contracts.subject import SubjectWrapper

HTTP_CONTRACTS = ["HTTP-STREAM-EQUALS-NONSTREAM", "HTTP-ONE-FINISH-REASON", "HTTP-USAGE-EXACT", "HTTP-BAD-INPUT-400",
                  "HTTP-CONCURRENT-STREAMS", "HTTP-DISCONNECT-ABORTS", "HTTP-METRICS"]


class WithMTP(SubjectWrapper):
    """Every server this subject launches speculates with the distilled assistant."""

    def base_url(self, argv):
        mtp = ["--prefill-attention-backend", "torch_native", "--speculative-algorithm", "NEXTN",
               "--speculative-draft-model-path", self.inner.tiny_model("assistant_distilled")]
        return self.inner.base_url([*argv, *mtp])


@pytest.mark.needs("http", "models")  # launches MTP servers with this project's tiny draft
@pytest.mark.parametrize("cid", HTTP_CONTRACTS)
def test_http_contract_with_mtp(cid, subject):
    get_contract(cid).run(WithMTP(subject))


def _get(url: str):
    with urllib.request.urlopen(url, timeout=120) as r:
        return r.read().decode()


def _post(url: str, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


@pytest.mark.needs("http", "models")
def test_speculation_is_visible_over_http(subject):
    url = WithMTP(subject).base_url(ARGV_OFF)
    out = _post(f"{url}/generate", {"input_ids": [2, 40, 41, 42, 43], "sampling_params": {
        "max_new_tokens": 9, "temperature": 0, "ignore_eos": True}})
    m = out["meta_info"]
    assert m["completion_tokens"] == 9 and m["spec_verify_ct"] >= 2
    assert m["spec_accept_length"] == pytest.approx(8 / m["spec_verify_ct"])
    info = json.loads(_get(f"{url}/get_server_info"))
    assert info["speculative_algorithm"] == "FROZEN_KV_MTP" and info["speculative_num_steps"] == 3
    assert info["max_running_requests"] == 48
    assert info["internal_states"][0]["avg_spec_accept_length"] >= 1.0
    metrics = _get(f"{url}/metrics")
    for name in ("sglang:spec_accept_length{", "sglang:spec_draft_tokens_total{", "sglang:spec_verify_tokens_total{"):
        assert name in metrics, name
