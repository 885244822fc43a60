"""Launchers reject bad inputs on the host with a message naming the problem; the interpreter is announced."""

from __future__ import annotations

import pytest
import torch

from impl.kernels import triton_env
from impl.kernels.decode_attention import decode_attention_fwd
from impl.kernels.extend_attention import extend_attention_fwd
from tests.helpers.kernel_cases import DEVICE, make_case


def call_extend(case, q=None, o=None, k_buf=None, window=None, q_positions=None):
    q = case.q if q is None else q
    return extend_attention_fwd(q, torch.empty_like(q) if o is None else o, case.k_buf if k_buf is None else k_buf,
                                case.v_buf, case.qo_indptr, case.q_positions if q_positions is None else q_positions,
                                case.kv_indptr, case.kv_indices, case.max_q_len, 1.0, window)


@pytest.fixture
def case():
    return make_case([2], [3], 2, 1, 32, torch.float32, seed=0)


def test_dtype_mismatch(case):
    with pytest.raises(ValueError, match="k_buf is torch.bfloat16 but v_buf torch.float32"):
        call_extend(case, k_buf=case.k_buf.to(torch.bfloat16))


def test_head_dim_out_of_range():
    small = make_case([1], [1], 1, 1, 8, torch.float32, seed=0)
    with pytest.raises(ValueError, match="head_dim 8 outside"):
        call_extend(small)


def test_gqa_heads_must_divide(case):
    q = torch.randn(3, 3, 32, device=DEVICE)
    k = torch.randn(case.k_buf.shape[0], 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        extend_attention_fwd(q, torch.empty_like(q), k, k, case.qo_indptr, case.q_positions, case.kv_indptr,
                             case.kv_indices, 3, 1.0)


def test_head_dim_must_be_contiguous(case):
    q = torch.randn(3, 2, 64, device=DEVICE)[:, :, ::2]  # stride 2 in head_dim
    with pytest.raises(ValueError, match="contiguous in head_dim"):
        call_extend(case, q=q)


def test_positions_per_query_row(case):
    with pytest.raises(ValueError, match="q_positions must have 3 entries"):
        call_extend(case, q_positions=case.q_positions[:2])


def test_window_must_be_positive(case):
    with pytest.raises(ValueError, match="window must be positive"):
        call_extend(case, window=-1)


def test_decode_split_count_per_request(case):
    d = make_case([4, 4], [1, 1], 2, 1, 32, torch.float32, seed=1)
    with pytest.raises(ValueError, match="num_kv_splits must have 2 entries"):
        decode_attention_fwd(d.q, torch.empty_like(d.q), d.k_buf, d.v_buf, d.q_positions, d.kv_indptr, d.kv_indices,
                             torch.ones(1, dtype=torch.int32, device=DEVICE), 1, 1.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: Triton compiles")
def test_interpreter_is_set_on_cpu():
    import os

    assert os.environ["TRITON_INTERPRET"] == "1"
    assert triton_env.TRITON_INTERPRETED


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_on_cuda():
    assert not triton_env.TRITON_INTERPRETED


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: Triton compiles")
@pytest.mark.slow  # a fresh interpreter
def test_kernels_work_when_torch_imported_triton_first():
    """torch._dynamo imports triton by itself (e.g. while building a model) before our triton_env may run;
    the kernels must still run interpreted (they avoid triton.language.standard's pre-decorated jit functions)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    code = (
        "import os; os.environ.pop('TRITON_INTERPRET', None)\n"
        "import triton, triton.language\n"  # what torch._dynamo does, before impl is imported
        "import torch; from tests.helpers.kernel_cases import make_case, assert_close_to_truth\n"
        "from tests.kernels.test_extend_attention import run_extend\n"
        "from tests.kernels.test_decode_attention import run_decode\n"
        "c = make_case([5], [4], 2, 1, 32, torch.float32, seed=0, window=3, logit_cap=2.0)\n"
        "assert_close_to_truth(run_extend(c), c, torch.float32)\n"
        "d = make_case([9], [1], 2, 1, 32, torch.float32, seed=1, window=4)\n"
        "assert_close_to_truth(run_decode(d, [2]), d, torch.float32)\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = root
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
