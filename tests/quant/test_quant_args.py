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
    (("--torchao-config-kv-shared", "8da4w-128"), r"--torchao-config-kv-shared 8da4w-128 gives the KV-shared layers their own format when --torchao-config quantizes"),
    (("--torchao-config", "int8dq", "--torchao-config-kv-shared", "int4wo"), r"--torchao-config-kv-shared 'int4wo' is not supported here; supported: int8dq"),
    (("--quantization", "w8a8_int8", "--torchao-config-kv-shared", "8da4w-128"), r"give --torchao-config too"),
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


def test_kv_shared_layers_take_their_own_format():
    """--torchao-config-kv-shared: the KV-shared layers' linears in that format, every other one (and the LM head,
    the per-layer-input projection) in --torchao-config's; the plan's packed bytes follow each weight's format."""
    from impl.config.model_config import ModelConfig
    from impl.model.gemma4 import Gemma4ForCausalLM
    from impl.quant.loading import plan_targets

    args = _check("--torchao-config", "int8dq", "--torchao-config-kv-shared", "8da4w-32")
    mc = ModelConfig.from_pretrained(tiny_checkpoint("e2b"))
    scheme = resolve_scheme(args.quantization, args.torchao_config, None, "cpu", args.torchao_config_kv_shared,
                            mc.num_kv_shared_layers)
    assert scheme.kv_shared is not None and scheme.kv_shared.kind == "w4a8" and scheme.lm_head.kind == "w8a8"
    assert "KV-shared layers w4a8" in scheme.describe()
    targets = plan_targets(Gemma4ForCausalLM(mc, device="meta"), scheme, None)
    shared = {n for n in targets.shapes if n.startswith("layers.") and int(n.split(".")[1]) >= mc.first_kv_shared_layer}
    assert shared and set(targets.formats) == shared
    for name, (n, k) in targets.shapes.items():
        fmt = targets.format_of(name)
        assert fmt.kind == ("w4a8" if name in shared else "w8a8") and targets.packed_bytes(name) == fmt.packed_bytes(n, k)
    # the same format for both: one format, nothing per layer
    assert resolve_scheme(None, "8da4w-32", None, "cpu", "8da4w-32", mc.num_kv_shared_layers).kv_shared is None


def test_kv_shared_format_refused_without_kv_shared_layers():
    with pytest.raises(ValueError, match=r"formats the KV-shared layers, but this model has none \(num_kv_shared_layers=0\); unset it"):
        resolve_scheme(None, "int8dq", None, "cpu", "8da4w-128", 0)
    with pytest.raises(ValueError, match="cannot re-quantize"):
        qc = {"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"g": {
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}}}}
        resolve_scheme(None, "int8dq", qc, "cpu", "8da4w-128", 4)
