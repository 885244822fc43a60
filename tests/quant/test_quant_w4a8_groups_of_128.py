"""Fast prefill with W4A8 in groups of 128 (``--torchao-config 8da4w-128``, the group size llama.cpp users and our
benchmarks run) on a checkpoint whose layers take it: the flag moves the cross-decoder's rows from one W4A8 kernel
to another (with the flag a handful of LM-head rows, which the AMX-int8 tiles stream from 2 rows; without it every
row of the prompt, the tiles' prefill path; the row kernel for one row and where the CPU has no tiles), and the
MLP's activation runs in the tiles' epilogue. QUANT-PARITY runs 8da4w-32 on the tiny checkpoint, whose 64-wide
layers no group of 128 fits; this is the same comparison at 128. Where the CPU has the tiles the weights are in tile
order (W4A8's VNNI kernel up to 4 rows, tiles from 5); with AVX-512 VNNI and no AMX too (the same VNNI kernel up to 8
rows, the blocked VNNI kernel from 9). Also with W4A8 in the KV-shared layers only, beside W8A8
(``--torchao-config int8dq --torchao-config-kv-shared 8da4w-128``): two formats in one model."""

from __future__ import annotations

import pytest
import torch

from contracts.yoco_engine import LOGPROB_TOL
from impl.checkpoint_factory.checkpoints import tiny_checkpoint

pytestmark = pytest.mark.slow  # starts engines

LENGTHS = (40, 9, 70, 33)  # 152 prefill rows at once; 4 LM-head rows with the flag; 4-row decode steps
NEW = 5


def _run(fast_prefill: bool, config: str, kv_shared: str) -> list[tuple[list[int], list[float]]]:
    from impl import Engine

    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 400, (n,), generator=gen).tolist() for n in LENGTHS]
    eng = Engine(tiny_checkpoint("e2b_bench"), torchao_config=config, torchao_config_kv_shared=kv_shared,
                 kv_sharing_fast_prefill=fast_prefill, disable_radix_cache=True, random_seed=0)
    try:
        q = eng.get_server_info()["quantization"]
        assert q["format"] == ("w4a8" if config == "8da4w-128" else "w8a8")
        assert q["kv_shared_format"] == ({"format": "w4a8", "group_size": 128} if kv_shared else None)
        outs = eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": NEW, "temperature": 0,
                                                                "ignore_eos": True}, return_logprob=True)
    finally:
        eng.shutdown()
    return [(o["output_ids"], [x[0] for x in o["meta_info"]["output_token_logprobs"]]) for o in outs]


@pytest.mark.parametrize("config,kv_shared", [("8da4w-128", ""), ("int8dq", "8da4w-128")])
def test_w4a8_groups_of_128_keep_fast_prefill_exact(config, kv_shared):
    off, on = _run(False, config, kv_shared), _run(True, config, kv_shared)
    for (ids_off, lp_off), (ids_on, lp_on) in zip(off, on):
        assert ids_on == ids_off and len(ids_on) == NEW
        assert max(abs(a - b) for a, b in zip(lp_on, lp_off)) <= LOGPROB_TOL
