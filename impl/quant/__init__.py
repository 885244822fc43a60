"""Quantized linear weights on CPU: int8 (W8A8, W8A16) and int4 (W4A16) (issue 32).

Where a format comes from (``config.py``): a checkpoint whose ``config.json`` carries a compressed-tensors
``quantization_config`` (as llm-compressor writes: W8A8 int8 with dynamic per-token activations, W4A16
pack-quantized), or a float checkpoint quantized while it loads under SGLang's ``--torchao-config``
(``int8dq``, ``int8wo``, ``int4wo-<group>``) or ``--quantization w8a8_int8``.

What is quantized (``targets``): every linear layer of the decoder layers (q/k/v/o, gate/up/down, the
per-layer-input gate and projection) and the model's per-layer-input projection; the LM head gets an int8
copy (W8A16) of the tied embedding unless ``IMPL_QUANT_LM_HEAD=0``. The embedding and per-layer-embedding
tables stay in the checkpoint dtype: they are only gathered.

How (``base.py`` has the layout): one packed tensor per weight, read by the fused CPU kernels
(``impl/kernels/cpu_fused/quant_linear.cpp``); ``reference.py`` is the torch definition of every kind.
"""
