"""Mutants of the fast-prefill argument rules (seed 000, F1-F12)."""

from __future__ import annotations

import dataclasses
import logging

from contracts.mutants import mutant
from contracts.mutants.patching import OutcomeMutant, PatchedSubject
from contracts.subject import SubjectWrapper

FIELD = "kv_sharing_fast_prefill"
FLAG = "--kv-sharing-fast-prefill"


@mutant("FLAG-DEFAULT-OFF")
class DefaultFlippedOn(SubjectWrapper):
    """The dataclass default of kv_sharing_fast_prefill is True."""

    def parse_args(self, argv):
        out = self.inner.parse_args(argv)
        out[FIELD] = True
        return out


@mutant("FLAG-CLI-PARSE")
class FlagNotParsed(SubjectWrapper):
    """--kv-sharing-fast-prefill is accepted on the command line but never sets the field."""

    def parse_args(self, argv):
        out = self.inner.parse_args(argv)
        out[FIELD] = False
        return out


@mutant("FLAG-ARGPARSE-REGISTERED")
class FlagTakesAValue(SubjectWrapper):
    """The option is registered as a value-taking option without help text."""

    def cli_options(self):
        opts = dict(self.inner.cli_options())
        if FLAG in opts:
            opts[FLAG] = dataclasses.replace(opts[FLAG], action="store", help="")
        return opts


@mutant("FLAG-MODELCONFIG-PLUMBING")
class ModelConfigDropsFlag(OutcomeMutant):
    """ModelConfig.from_server_args forgets to pass kv_sharing_fast_prefill."""

    def mutate(self, argv, out):
        out.model_config[FIELD] = False
        return out


def _pin_always(server_args):
    from impl.args.resolution import declare_resolution, resolving_view

    cfg = resolving_view(server_args)
    if cfg.attention_backend is None and cfg.prefill_attention_backend is None:
        declare_resolution(server_args, "handle_kv_sharing_fast_prefill_backend", attention_backend="triton")


@mutant("FLAG-OFF-NOOP")
class PinsTritonWhenOff(PatchedSubject):
    """The triton pin runs even when the flag is off."""

    PATCHES = {"impl.args.kv_sharing:handle_kv_sharing_fast_prefill_backend": _pin_always}


def _wrong_log(server_args):
    from impl.args.resolution import model_config_of, resolving_view

    if resolving_view(server_args).kv_sharing_fast_prefill:
        mc = model_config_of(server_args)
        logging.getLogger("impl.args").warning("KV sharing fast prefill on for %s (%d shared)", mc.name, mc.num_kv_shared_layers)


@mutant("FLAG-ON-STARTUP-LOG", "RES-UNSET-BACKEND-TRITON")
class WrongLogText(PatchedSubject):
    """The startup line has other words and is logged at WARNING."""

    PATCHES = {"impl.args.kv_sharing:log_kv_sharing_fast_prefill": _wrong_log}


def _platform_only_backend_default(server_args) -> None:
    """The backend default of a platform-only rule: triton on CUDA, torch_native on CPU, whatever the model."""
    from impl.args.resolution import declare_resolution, platform_of, resolved_view

    if resolved_view(server_args).attention_backend is None:
        choice = "triton" if platform_of(server_args).is_cuda else "torch_native"
        declare_resolution(server_args, "handle_attention_backend_default", attention_backend=choice)


@mutant("RES-UNSET-BACKEND-TRITON")
class UnsetBackendNotPinned(PatchedSubject):
    """An unset backend is left to the platform default (torch_native on CPU) instead of resolving to triton:
    no fast-prefill pin, and a backend default that ignores the model (Gemma-4's triton default would otherwise
    hide the missing pin)."""

    PATCHES = {
        "impl.args.kv_sharing:handle_kv_sharing_fast_prefill_backend": lambda server_args: None,
        "impl.args.attention:handle_attention_backend_default": _platform_only_backend_default,
    }


@mutant("SPEC-NEXTN-ACCEPTED")
class NextnNotPromoted(PatchedSubject):
    """NEXTN is accepted but never promoted to FROZEN_KV_MTP."""

    PATCHES = {"impl.args.speculative:handle_speculative_algorithm": lambda server_args: None}


class _Accepts(OutcomeMutant):
    """Clears the error when ``WHEN(argv, message)`` holds."""

    def mutate(self, argv, out):
        if out.error is not None and self.when(argv, str(out.error)):
            out.error = None
        return out

    def when(self, argv, msg) -> bool:
        raise NotImplementedError


@mutant("VAL-REJECT-NON-GEMMA4")
class AcceptsNonGemma4(_Accepts):
    """Fast prefill accepted on any architecture."""

    def when(self, argv, msg):
        return "Gemma-4 model" in msg


@mutant("VAL-REJECT-NON-TRITON")
class AcceptsAnyBackend(_Accepts):
    """Fast prefill accepted with any prefill backend."""

    def when(self, argv, msg):
        return "triton attention backend" in msg


@mutant("VAL-REJECT-NO-SHARED-LAYERS")
class AcceptsNoSharedLayers(_Accepts):
    """Fast prefill accepted on a model with num_kv_shared_layers == 0."""

    def when(self, argv, msg):
        return "num_kv_shared_layers=0" in msg


@mutant("VAL-REJECT-EAGLE")
class AcceptsEagle(_Accepts):
    """EAGLE accepted with fast prefill."""

    def when(self, argv, msg):
        return "EAGLE" in argv and "--speculative-algorithm EAGLE:" in msg


@mutant("VAL-REJECT-EAGLE3")
class AcceptsEagle3(_Accepts):
    """EAGLE3 accepted with fast prefill."""

    def when(self, argv, msg):
        return "EAGLE3" in argv


@mutant("SPEC-NEXTN-NEEDS-ASSISTANT")
class NextnAnyDraft(_Accepts):
    """NEXTN accepted with any draft model."""

    def when(self, argv, msg):
        return "NEXTN" in argv


@mutant(
    "VAL-REJECT-NON-GEMMA4",
    "VAL-REJECT-NON-TRITON",
    "VAL-REJECT-NO-SHARED-LAYERS",
    "VAL-REJECT-EAGLE",
    "VAL-REJECT-EAGLE3",
    "SPEC-NEXTN-NEEDS-ASSISTANT",
)
class VagueErrors(OutcomeMutant):
    """Rejections keep their type but say only 'invalid server arguments'."""

    def mutate(self, argv, out):
        if out.error is not None:
            out.error = type(out.error)("invalid server arguments")
        return out
