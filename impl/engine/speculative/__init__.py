"""Speculative decoding: FROZEN_KV_MTP (NEXTN with a Gemma-4 assistant draft over the target's K/V)."""

from impl.engine.speculative.frozen_kv_mtp_worker import FrozenKVMTPWorker, SpecConfig, SpecStats

__all__ = ["FrozenKVMTPWorker", "SpecConfig", "SpecStats"]


def build_spec_worker(args, runner) -> "FrozenKVMTPWorker | None":
    """The FROZEN_KV_MTP worker for RESOLVED server args (None without speculation): loads the assistant
    in the target's dtype on its device and binds it to the target's embedding and K/V."""
    if args.speculative_algorithm != "FROZEN_KV_MTP":
        return None
    from impl.engine.model_runner import install_cpu_kernels
    from impl.engine.speculative.draft import FrozenKVDrafter
    from impl.model.loader import load_model

    assistant = load_model(args.speculative_draft_model_path, runner.dtype, runner.device)
    assistant.attach_target(runner.model)
    install_cpu_kernels(assistant, runner.device)
    config = SpecConfig(args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens)
    return FrozenKVMTPWorker(config, FrozenKVDrafter(assistant, runner), assistant.config.name)
