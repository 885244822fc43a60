"""The ``impl`` subject: our engine, in process."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from contracts.logcapture import capture_logs, patched_env
from contracts.subject import CheckOutcome, OptionInfo


def _model_config_dict(mc: Any) -> dict[str, Any]:
    if mc is None:
        return {}
    out = {f.name: getattr(mc, f.name) for f in dataclasses.fields(mc)}
    out["is_gemma4"] = mc.is_gemma4
    out["is_hybrid_swa"] = mc.is_hybrid_swa
    return out


class ImplSubject:
    name = "impl"
    capabilities = frozenset({"args", "refuse", "engine", "models", "faults", "http", "bench", "impl"})

    # ---- args --------------------------------------------------------------------
    def parse_args(self, argv: Sequence[str]) -> dict[str, Any]:
        from impl.args.server_args import ServerArgs

        return ServerArgs.parse(argv).user_dict()

    def cli_options(self) -> Mapping[str, OptionInfo]:
        from impl.args.server_args import make_parser

        out = {}
        for act in make_parser()._actions:
            for opt in act.option_strings:
                if opt.startswith("--") and opt != "--help":
                    kind = type(act).__name__
                    action = {"_StoreTrueAction": "store_true", "_StoreAction": "store"}.get(kind, kind)
                    out[opt] = OptionInfo(opt, act.dest, action, act.default, act.help or "")
        return out

    def check(self, argv: Sequence[str], platform: str = "cpu", env: Mapping[str, str] | None = None) -> CheckOutcome:
        from impl.args.check import check_server_args
        from impl.args.platform import Platform
        from impl.args.resolution import resolutions_of
        from impl.args.server_args import ServerArgs
        from impl.config.model_config import ModelConfig

        args = ServerArgs.parse(argv)
        error: BaseException | None = None
        with patched_env(dict(env or {})), capture_logs("impl") as log:
            try:
                check_server_args(args, platform=Platform.by_name(platform))
            except (ValueError, RuntimeError) as e:
                error = e
        # F4: the model config an engine would build, through from_server_args.
        mc = ModelConfig.from_server_args(args) if args.model_path else None
        return CheckOutcome(
            user=args.user_dict(),
            resolved=args.resolved().user_dict(),
            resolutions=[(r.source, r.field, r.value) for r in resolutions_of(args)],
            log=list(log),
            model_config=_model_config_dict(mc),
            error=error,
        )

    def refuse(self, argv: Sequence[str], platform: str = "cpu") -> BaseException | None:
        from impl.args import unsupported
        from impl.args.check import check_server_args
        from impl.args.platform import Platform
        from impl.args.server_args import ServerArgs

        args = ServerArgs.parse(argv)
        with capture_logs("impl"):
            try:
                check_server_args(args, platform=Platform.by_name(platform))
                unsupported.refuse_unimplemented(args)
            except (ValueError, RuntimeError) as e:
                return e
        return None

    # ---- engine / http: provided by the engine and server issues -------------------
    def generate(self, argv, requests, batched=True):
        from contracts.adapters.impl_engine import generate

        return generate(argv, requests, batched)

    def isolated(self):
        """Context in which generation uses private engines (mutants run inside one)."""
        from contracts.adapters.impl_engine import isolated_engines

        return isolated_engines()

    def generate_with_faults(self, argv, runs):
        """``faults`` capability: runs of (GenRequest, rid) on a private engine, a rid naming a stage
        (``contracts.fault_injection.STAGES``) fails there; per request every final output."""
        from contracts.fault_injection import run_with_faults

        return run_with_faults(argv, runs)

    def tiny_model(self, name: str) -> str:
        from impl.checkpoint_factory.checkpoints import tiny_checkpoint

        if name == "assistant_oracle":  # see impl_engine.engine_for
            from impl.testing.oracle_draft import ORACLE_PREFIX

            return ORACLE_PREFIX + tiny_checkpoint("assistant")
        return tiny_checkpoint(name)

    def base_url(self, argv):
        from contracts.adapters.impl_http import base_url

        return base_url(argv)

    # ---- bench: in process, on the process's CPU clock -----------------------------
    def timed_generate(self, argv, requests):
        from contracts.adapters.impl_engine import timed_generate

        return timed_generate(argv, requests)

    def model_config(self, argv):
        return self.check(argv).model_config
