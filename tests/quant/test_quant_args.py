"""--quantization and --torchao-config at startup: what is served, and every refusal names the flag and the fix."""

from __future__ import annotations

import pytest

from impl.args import Platform, ServerArgs, check_server_args
from impl.quant.config import resolve_scheme
from impl.checkpoint_factory.checkpoints import tiny_checkpoint


def _check(*argv: str, platform: Platform | None = None) -> ServerArgs:
    args = ServerArgs.parse(["--model-path", tiny_checkpoint("e2b"), *argv])
    check_server_args(args, platform=platform or Platform.cpu())
    return args


@pytest.mark.parametrize("argv,kind", [
    (("--torchao-config", "int8dq"), "w8a8"), (("--torchao-config", "int8wo"), "w8a16"),
    (("--torchao-config", "int4wo-128"), "w4a16"), (("--quantization", "w8a8_int8"), "w8a8"),
    (("--torchao-config", "8da4w-128"), "w4a8"), (("--torchao-config", "8da4w-32"), "w4a8"),
])
def test_accepted(argv, kind):
    args = _check(*argv)
    scheme = resolve_scheme(args.quantization, args.torchao_config, None)
    assert scheme is not None and scheme.fmt.kind == kind and not scheme.prequantized


@pytest.mark.parametrize("argv,match", [
    (("--quantization", "awq"), r"--quantization 'awq' is a quantization method of SGLang's that this engine does not implement; supported: --quantization w8a8_int8 or compressed-tensors"),
    (("--quantization", "int3"), r"not a known quantization method"),
    (("--torchao-config", "fp8wo"), r"--torchao-config 'fp8wo' is not supported here; supported: int8dq, int8wo, int4wo-32"),
    (("--torchao-config", "int4wo-100"), r"group size of 32, 64, 128, 256"),
    (("--torchao-config", "8da4w"), r"int4wo and 8da4w take a group size of 32, 64, 128, 256"),
    (("--quantization", "w8a8_int8", "--torchao-config", "int8wo"), r"both quantize the weights; give one"),
    (("--quantization", "compressed-tensors"), r"needs a checkpoint whose config.json has a compressed-tensors quantization_config"),
    (("--torchao-config", "int8dq", "--enable-deterministic-inference", "--dtype", "bfloat16"), r"--enable-deterministic-inference is implemented for bf16 weights"),
])
def test_refused_naming_the_flag(argv, match):
    with pytest.raises(ValueError, match=match):
        _check(*argv)


def test_cuda_refused():
    with pytest.raises(ValueError, match="run on CPU only"):
        resolve_scheme(None, "int8dq", None, "cuda")


@pytest.mark.parametrize("qc,match", [
    ({"quant_method": "awq"}, "quant_method 'awq'"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}}}, "format": "marlin-24"}, "format 'marlin-24'"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}, "input_activations": {"num_bits": 8, "strategy": "tensor", "dynamic": False}}}}, "without dynamic symmetric per-token"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}}}, "weights of type 'float'"),
])
def test_unservable_checkpoints_refused(qc, match):
    with pytest.raises(ValueError, match=match):
        resolve_scheme(None, None, qc)


def test_prequantized_checkpoint_cannot_be_requantized():
    qc = {"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"g": {
        "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}}}}
    assert resolve_scheme(None, None, qc).prequantized
    assert resolve_scheme("w8a8_int8", None, qc).fmt.kind == "w8a8"
    with pytest.raises(ValueError, match="cannot re-quantize"):
        resolve_scheme(None, "int4wo-128", qc)
