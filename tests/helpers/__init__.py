"""Helpers shared by the test folders, imported as ``tests.helpers.<module>`` (pytest puts the repository root on
``sys.path``: ``pythonpath`` in pyproject.toml).

- ``model``: tiny models, the transformers reference and its tolerance rule, prompts, the model-test fixtures;
- ``session``: a minimal serving loop (pools, slots, ForwardBatch packing) for model-level tests;
- ``engines``: engines on tiny checkpoints, cached per settings, and transformers' greedy references;
- ``fake_runner``: a model-free runner whose logits are a function of the context, for scheduler tests;
- ``kernel_cases``: random paged-attention cases and the kernel tolerance rule;
- ``engine_outputs``: seeded prompts and per-token logprobs for bit-for-bit comparisons of engine runs.
"""
