"""SGLang bench_serving's ``random-ids`` dataset.

Lengths are drawn uniformly from ``[max(1, int(len * range_ratio)), len]`` (inclusive),
input and output independently, with numpy's legacy global generator seeded by
``seed`` (``np.random.seed``), as ``sample_random_requests`` does; each prompt is a run
of consecutive token ids ``(offset + i + j) % vocab_size`` from a random offset, so it is
reproducible from (seed, lengths, vocab size) alone and needs no tokenizer or network.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DatasetRow:
    prompt_ids: list[int]
    prompt_len: int
    output_len: int


def random_ids(
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    vocab_size: int,
    seed: int,
    min_id: int = 0,
) -> list[DatasetRow]:
    """``num_prompts`` rows of token ids in ``[min_id, vocab_size)`` (``min_id`` skips special ids)."""
    if num_prompts < 1 or input_len < 1 or output_len < 1:
        raise ValueError(f"num_prompts, input_len and output_len must be >= 1, got {num_prompts}, {input_len}, {output_len}")
    if not 0.0 <= range_ratio <= 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1], got {range_ratio}")
    if vocab_size <= min_id:
        raise ValueError(f"vocab_size {vocab_size} leaves no token ids at or above {min_id}")
    np.random.seed(seed)
    in_lens = np.random.randint(max(int(input_len * range_ratio), 1), input_len + 1, size=num_prompts)
    out_lens = np.random.randint(max(int(output_len * range_ratio), 1), output_len + 1, size=num_prompts)
    span = vocab_size - min_id
    offsets = np.random.randint(0, span, size=num_prompts)
    return [
        DatasetRow([min_id + int((offsets[i] + i + j) % span) for j in range(int(in_lens[i]))], int(in_lens[i]), int(out_lens[i]))
        for i in range(num_prompts)
    ]
