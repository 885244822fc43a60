"""Subject: the narrow interface an implementation offers the contracts.

Everything goes through the command line an operator would type (``argv``) and
neutral records, so any engine (ours, a patched SGLang, a mutant) can be
plugged in by writing an adapter.

Capabilities (``CAPABILITY_OF`` maps each method to its capability):
* ``args``: ``parse_args``, ``cli_options``, ``check`` (validation and
  resolution against a model folder and a named platform, with the startup log).
  A command line the subject's parser refuses raises ``contracts.base.CommandLineRefused``.
* ``refuse``: ``refuse`` (launch-time refusal of settings the engine does not implement).
* ``engine``: ``generate`` (token ids, logprobs, per-forward work counters).
* ``models``: ``tiny_model`` (this project's tiny checkpoints, which the subject can serve).
* ``faults``: ``generate_with_faults``.
* ``http``: ``base_url`` of a running server started from ``argv`` (a subject at a URL
  has one or two servers and ignores the rest of ``argv``).
* ``bench``: ``timed_generate`` (per-request TTFT, latency and output tokens of requests
  sent together to the launch ``argv``) and ``model_config`` (the config fields the
  launch serves, for FLOP bounds). The clock is the subject's: wall time over HTTP,
  the process's CPU time in process (immune to other jobs on a shared machine).
* ``impl``: this project's engine in process (``isolated``; mutants patch it).

``CapabilityGuard`` wraps a subject so that using a capability it lacks raises
``MissingCapability`` (a ``NotApplicable`` naming the capability) instead of an
``AttributeError``: against any subject every spec test runs or is skipped with the
missing capability named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol, Sequence

from contracts.base import NotReached

PLATFORMS = ("cpu", "ampere", "hopper", "sm100", "sm120")

CAPABILITY_OF = {
    "parse_args": "args", "cli_options": "args", "check": "args",
    "refuse": "refuse",
    "generate": "engine",
    "tiny_model": "models",
    "generate_with_faults": "faults",
    "base_url": "http",
    "timed_generate": "bench", "model_config": "bench",
    "isolated": "impl",
}


@dataclass(frozen=True)
class OptionInfo:
    option: str  # "--kv-sharing-fast-prefill"
    dest: str  # "kv_sharing_fast_prefill"
    action: str  # "store_true", "store", ...
    default: Any
    help: str


@dataclass
class CheckOutcome:
    """What ``check`` observed. ``error`` is a ValueError/RuntimeError the subject raised, else None."""

    user: dict[str, Any]  # the values as parsed (resolving view)
    resolved: dict[str, Any]  # after every declared resolution
    resolutions: list[tuple[str, str, Any]]  # (source, field, value)
    log: list[tuple[str, str]]  # (levelname, message) emitted while checking
    model_config: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None

    @property
    def accepted(self) -> bool:
        return self.error is None

    def messages(self, level: str | None = None) -> list[str]:
        return [m for lv, m in self.log if level is None or lv == level]


@dataclass(frozen=True)
class GenRequest:
    input_ids: Sequence[int]
    max_new_tokens: int = 8
    temperature: float = 0.0
    seed: int | None = None
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int = 0
    ignore_eos: bool = True
    top_k: int = -1


@dataclass
class GenOutput:
    output_ids: list[int]
    output_logprobs: list[float] = field(default_factory=list)
    input_logprobs: list[float | None] = field(default_factory=list)
    finish_reason: Any = None
    cached_tokens: int = 0
    # speculative decoding (meta_info): verifies and mean tokens committed per verify; None without it
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None


@dataclass
class GenResult:
    outputs: list[GenOutput]
    work: dict[str, int]  # WorkCounters summed over the run
    log: list[tuple[str, str]] = field(default_factory=list)
    # KV slots after the run: usable slots, and how many are free or held only by the
    # (evictable) prefix cache. Every request finished => the two are equal.
    kv_capacity: int | None = None
    kv_available_after: int | None = None


@dataclass(frozen=True)
class TimedOutput:
    """One request's timing, in seconds of ``clock`` from its submission."""

    ttft: float  # to the first output token
    latency: float  # to the last one
    output_tokens: int
    clock: str  # "wall" | "process_cpu"

    @property
    def tpot(self) -> float | None:
        """SGLang's time per output token: (latency - TTFT) / (output tokens - 1)."""
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


class Subject(Protocol):
    name: str
    capabilities: frozenset[str]

    # ---- args ------------------------------------------------------------------
    def parse_args(self, argv: Sequence[str]) -> dict[str, Any]: ...

    def cli_options(self) -> Mapping[str, OptionInfo]: ...

    def check(self, argv: Sequence[str], platform: str = "cpu", env: Mapping[str, str] | None = None) -> CheckOutcome: ...

    def refuse(self, argv: Sequence[str], platform: str = "cpu") -> BaseException | None:
        """Launch-time refusal: validate ``argv`` like ``check``, then refuse settings whose feature the
        engine does not implement. The ValueError/RuntimeError it would stop with, or None to go on."""
        ...

    # ---- engine ------------------------------------------------------------------
    def generate(self, argv: Sequence[str], requests: Sequence[GenRequest], batched: bool = True) -> GenResult: ...

    def tiny_model(self, name: str) -> str:
        """Folder of a tiny HF checkpoint (config.json, safetensors, tokenizer) this subject can serve:
        "e2b" (35 layers, 20 KV-shared), "k_eq_v", "moe", "noshare"; MTP drafts for "e2b": "assistant"
        (random weights), "assistant_distilled" (distilled from "e2b"), "assistant_oracle" (proposes the
        target's own greedy tokens; engine subjects only)."""
        ...

    # ---- http --------------------------------------------------------------------
    def base_url(self, argv: Sequence[str]) -> str: ...

    # ---- bench -------------------------------------------------------------------
    def timed_generate(self, argv: Sequence[str], requests: Sequence[GenRequest]) -> list[TimedOutput]:
        """Send ``requests`` together (greedy, streaming) to the launch ``argv``; one TimedOutput each."""
        ...

    def model_config(self, argv: Sequence[str]) -> dict[str, Any]:
        """The served model's config fields (ModelConfig names) for the launch ``argv``."""
        ...


class SubjectWrapper:
    """Delegates everything to ``inner``; mutants override one method."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name = f"{type(self).__name__}({inner.name})"
        self.capabilities = inner.capabilities

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# The kinds of subject (``--subject``) and their capabilities; spec/test_subject_kinds.py holds each adapter to its
# row. ``cuda``: this project's engine on a machine with a CUDA device.
SUBJECT_KINDS: dict[str, frozenset[str]] = {
    "impl": frozenset({"args", "refuse", "engine", "models", "faults", "http", "bench", "impl"}),
    "impl on CUDA": frozenset({"args", "refuse", "engine", "models", "faults", "http", "bench", "impl", "cuda"}),
    "sglang": frozenset({"args"}),
    "vllm": frozenset({"args"}),
    "http://URL": frozenset({"http"}),
    "http://URL + --subject-fast-prefill": frozenset({"http", "bench"}),
}


def kinds_reaching(capabilities: Iterable[str]) -> list[str]:
    """The subject kinds that have every capability in ``capabilities``."""
    need = set(capabilities)
    return [k for k, caps in SUBJECT_KINDS.items() if need <= caps]


def not_reached(subject: str, missing: Iterable[str]) -> NotReached:
    """The verdict for a subject that lacks ``missing`` capabilities: which, and which kinds would reach it."""
    missing = sorted(missing)
    kinds = kinds_reaching(missing)
    return NotReached(f"subject {subject} lacks capabilities {missing}; reached by --subject "
                      + (" or ".join(kinds) if kinds else "no kind of subject"), ",".join(missing), kinds)


class MissingCapability(NotReached):
    """A contract or test used a capability the subject does not have."""

    def __init__(self, subject: str, capability: str, method: str):
        kinds = kinds_reaching([capability])
        super().__init__(f"subject {subject} lacks the {capability!r} capability ({method}); reached by --subject "
                         + " or ".join(kinds), capability, kinds)


class CapabilityGuard(SubjectWrapper):
    """The subject as the spec sees it: a method of a capability the subject lacks raises ``MissingCapability``."""

    def __init__(self, inner: Any):
        super().__init__(inner)
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        cap = CAPABILITY_OF.get(name)
        if cap is not None and cap not in self.capabilities:
            raise MissingCapability(self.name, cap, name)
        return getattr(self.inner, name)

    def describe(self) -> str:
        return getattr(self.inner, "describe", lambda: self.inner.name)()
