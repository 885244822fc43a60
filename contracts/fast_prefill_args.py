"""Seed 000 (PR-A, "Behaviour"): the ``--kv-sharing-fast-prefill`` flag rules F1-F12.

The flag's refusals are judged differentially: a command line the seed says the flag refuses (or keeps) is also
checked without the flag, and when the subject refuses it without the flag too, the refusal is not the flag's and
the case is inconclusive (an engine's own rules about the same command line, say a draft model it does not
support, are not seed 000's). The flag must refuse exactly where the seed says, and otherwise change nothing.
"""

from __future__ import annotations

from contracts.base import case, contract, inconclusive, require, require_option
from contracts.expect import expect_accepted, expect_equal, expect_rejected
from contracts.models import argv_for
from contracts.subject import CheckOutcome

SEED = "seeds/000 PR-A"
FLAG = "--kv-sharing-fast-prefill"
FIELD = "kv_sharing_fast_prefill"
E2B, E4B, DENSE31B, ASSISTANT = "gemma-4-E2B-it", "gemma-4-E4B-it", "gemma-4-31B-it", "gemma-4-E2B-it-assistant"
# The seed's startup line is "KV-sharing fast prefill enabled for (num_kv_shared_layers=N)" (the model's name was
# lost in its copy): the contracts ask for those words and the count, not this project's exact format.
ENABLED = "KV-sharing fast prefill enabled for {model} (num_kv_shared_layers={n})"


def _is_enabled_line(message: str, n: int) -> bool:
    """The seed's startup line: its words and the layer count, whatever else the engine puts in it."""
    return "kv-sharing fast prefill enabled" in message.lower() and f"num_kv_shared_layers={n}" in message
# The options each rule is about (contracts.base.Contract.options): an engine without the flag is out of scope.
ONLY_FLAG = (FLAG,)
SWITCH_ACTIONS = ("store_true", "BooleanOptionalAction")
BACKEND_OPTIONS = (FLAG, "--attention-backend", "--prefill-attention-backend", "--decode-attention-backend")
SPEC_OPTIONS = (FLAG, "--speculative-algorithm", "--speculative-draft-model-path")


def _without_flag(argv: list[str]) -> list[str]:
    return [a for a in argv if a != FLAG]


def _not_the_flags(subject, argv: list[str], out: CheckOutcome, what: str) -> None:
    """A refusal with the flag that the subject makes without it too is not the flag's: inconclusive."""
    if out.error is None:
        return
    base = subject.check(_without_flag(argv))
    if base.error is not None:
        raise inconclusive(f"{what}: refused with the flag ({type(out.error).__name__}: {out.error}), and without it "
                           f"too ({type(base.error).__name__}: {base.error}): the refusal is not the flag's")


def flag_refuses(subject, argv: list[str], what: str, mentions: tuple[str, ...]) -> None:
    """Seed 000: the flag refuses ``argv`` (a ValueError naming ``mentions``), where the subject accepts it without."""
    out = subject.check(argv)
    _not_the_flags(subject, argv, out, what)
    expect_rejected(out, what, mentions=mentions)


def flag_keeps(subject, argv: list[str], what: str) -> CheckOutcome:
    """Seed 000: the flag does not refuse ``argv`` (the subject's decision without it stands)."""
    out = subject.check(argv)
    _not_the_flags(subject, argv, out, what)
    return expect_accepted(out, what)


def _mentions_fast_prefill(text: str) -> bool:
    t = text.lower()
    return "fast prefill" in t or "fast_prefill" in t or "kv-sharing" in t or "kv_sharing" in t


@contract(
    "FLAG-DEFAULT-OFF", f"{SEED}, File table (server_args.py) and Behaviour: 'Default: off'", rules=("F1",), options=ONLY_FLAG,
)
def flag_default_off(subject) -> None:
    """ServerArgs has a kv_sharing_fast_prefill field that is False unless the user asks for it."""
    require_option(subject, FLAG)
    # The command line an operator types has a model (SGLang's parser requires --model-path): the default is
    # what a model path and no other flag gives.
    args = subject.parse_args(argv_for(E2B))
    require(FIELD in args, f"ServerArgs must have a field {FIELD!r}; it has {len(args)} fields, none of them "
                           f"{FIELD} (e.g. {sorted(k for k in args if 'prefill' in k)[:6]})")
    expect_equal(args[FIELD], False, f"default of {FIELD} for a Gemma-4 model path and no other flag")
    args = subject.parse_args(argv_for("Llama-3.1-8B-Instruct"))
    expect_equal(args[FIELD], False, f"{FIELD} for a non-Gemma-4 model path without {FLAG}")


@contract(
    "FLAG-CLI-PARSE", f"{SEED}, File table: argparse --kv-sharing-fast-prefill (store_true)", rules=("F2",), options=ONLY_FLAG,
    rule=f"{FLAG} on the command line parses to kv_sharing_fast_prefill=True; without it, False.",
)
def flag_cli_parse(subject) -> None:
    require_option(subject, FLAG)
    expect_equal(subject.parse_args(argv_for(E2B, FLAG))[FIELD], True, f"{FIELD} after parsing [--model-path ... {FLAG}]")
    expect_equal(subject.parse_args(argv_for(E2B, "--port", "31000")).get(FIELD), False, f"{FIELD} when {FLAG} is absent")
    on = subject.parse_args(argv_for(E2B, FLAG, "--attention-backend", "triton"))
    expect_equal(on[FIELD], True, f"{FIELD} parsed among other flags")


@contract(
    "FLAG-ARGPARSE-REGISTERED", f"{SEED}, File table: argparse --kv-sharing-fast-prefill (store_true)", rules=("F3",), options=ONLY_FLAG,
    rule=f"{FLAG} is registered with argparse as a boolean switch (store_true; a BooleanOptionalAction, which adds "
    "--no-..., is the same switch) with help text naming what it does.",
)
def flag_argparse_registered(subject) -> None:
    require_option(subject, FLAG)
    opts = subject.cli_options()
    require(FLAG in opts, f"{FLAG} must be a registered command-line option")
    opt = opts[FLAG]
    require(opt.action in SWITCH_ACTIONS, f"argparse action of {FLAG}: expected a switch ({', '.join(SWITCH_ACTIONS)}), "
                                          f"got {opt.action!r}")
    expect_equal(opt.dest, FIELD, f"argparse dest of {FLAG}")
    require(opt.default is False, f"{FLAG} default must be False, got {opt.default!r}")
    require(
        len(opt.help) >= 20 and "prefill" in opt.help.lower(),
        f"{FLAG} needs help text saying what it does (mentioning prefill); got {opt.help!r}",
    )


@contract(
    "FLAG-MODELCONFIG-PLUMBING", f"{SEED}, File table (model_config.py): kwarg on ModelConfig.init, from_server_args plumbs the flag", rules=("F4",), options=ONLY_FLAG,
)
def flag_modelconfig_plumbing(subject) -> None:
    """ModelConfig takes kv_sharing_fast_prefill and ModelConfig.from_server_args passes the flag through."""
    require_option(subject, FLAG)
    on = subject.check(argv_for(E2B, FLAG))
    off = subject.check(argv_for(E2B))
    expect_equal(on.model_config.get(FIELD), True, f"ModelConfig.{FIELD} built from args with {FLAG}")
    expect_equal(off.model_config.get(FIELD), False, f"ModelConfig.{FIELD} built from args without {FLAG}")
    rest_on = {k: v for k, v in on.model_config.items() if k != FIELD}
    rest_off = {k: v for k, v in off.model_config.items() if k != FIELD}
    require(rest_on == rest_off, "the flag must change nothing in ModelConfig but kv_sharing_fast_prefill")


# Settings that are valid without the flag; with the flag off none may be touched by it.
_OFF_CASES = [
    argv_for(E2B),
    argv_for(E2B, "--attention-backend", "torch_native"),
    argv_for(DENSE31B),
    argv_for("Llama-3.1-8B-Instruct"),
    argv_for("Qwen2.5-7B-Instruct", "--attention-backend", "torch_native"),
    argv_for(E2B, "--speculative-algorithm", "EAGLE3"),
    argv_for(E2B, "--speculative-algorithm", "EAGLE"),
]


@contract(
    "FLAG-OFF-NOOP", f"{SEED}, Behaviour: 'Default: off. No effect on any existing deployment.'", rules=("F5",), options=ONLY_FLAG,
)
def flag_off_noop(subject) -> None:
    """With the flag off nothing changes: no fast-prefill rule rejects, resolves, or logs anything, for any model."""
    require_option(subject, FLAG)
    for argv in _OFF_CASES:
        with case(" ".join(argv[2:]) or "a model path alone"):
            out = subject.check(argv)
            if out.error is not None:
                require(
                    not _mentions_fast_prefill(str(out.error)),
                    f"flag off, {argv[2:]} was rejected for a fast-prefill reason: {out.error}",
                )
            lines = [m for _, m in out.log if _mentions_fast_prefill(m)]
            require(not lines, f"flag off, {argv[2:]}: the startup log must not mention fast prefill; got {lines}")
            by_flag = [r for r in out.resolutions if _mentions_fast_prefill(r[0])]
            require(not by_flag, f"flag off, {argv[2:]}: fast-prefill rules declared resolutions {by_flag}")
            expect_equal(out.resolved.get(FIELD), False, f"resolved {FIELD} with the flag off")
            if "--attention-backend" in argv:
                given = argv[argv.index("--attention-backend") + 1]
                expect_equal(out.resolved.get("attention_backend"), given, "an explicit attention backend with the flag off")
    # Same model, flag absent vs explicitly on: model config identical apart from the flag.
    off = subject.check(argv_for(E2B, "--attention-backend", "triton"))
    on = subject.check(argv_for(E2B, FLAG, "--attention-backend", "triton"))
    expect_accepted(off, "E2B with triton and the flag off")
    expect_accepted(on, "E2B with triton and the flag on")
    diff = {k for k in set(off.resolved) | set(on.resolved) if off.resolved.get(k) != on.resolved.get(k)}
    require(diff == {FIELD}, f"turning the flag on must change only {FIELD} in the resolved args; changed {sorted(diff)}")


@contract("FLAG-ON-STARTUP-LOG", f"{SEED}, Behaviour: 'logs ... at startup'", rules=("F6",), options=ONLY_FLAG)
def flag_on_startup_log(subject) -> None:
    """Flag on + Gemma-4 + triton + num_kv_shared_layers > 0 logs one INFO line 'KV-sharing fast prefill enabled for
    ... (num_kv_shared_layers=N)' (the seed's words and the count)."""
    require_option(subject, FLAG)
    for model, n in ((E2B, 20), (E4B, 18), ("gemma-4-E2B-mm", 20)):
        with case(model):
            _startup_line(subject, model, n)


def _startup_line(subject, model: str, n: int) -> None:
    out = flag_keeps(subject, argv_for(model, FLAG, "--attention-backend", "triton"), f"{FLAG} on {model} with triton")
    want = ENABLED.format(model=model, n=n)
    hits = [(lv, m) for lv, m in out.log if _is_enabled_line(m, n)]
    require(len(hits) == 1, f"expected exactly one log line like {want!r} (the seed's words and "
                            f"num_kv_shared_layers={n}); got {[m for _, m in out.log if 'fast prefill' in m.lower()]}")
    expect_equal(hits[0][0], "INFO", f"level of {hits[0][1]!r}")


@contract(
    "VAL-REJECT-NON-GEMMA4", f"{SEED}, Behaviour: 'When set on a non-Gemma-4 model ... clear ValueError at startup'", rules=("F7",), options=ONLY_FLAG,
)
def reject_non_gemma4(subject) -> None:
    """Flag on with a model that is not Gemma-4 is a ValueError at startup naming the flag, the model type and the
    fix."""
    require_option(subject, FLAG)
    for model, mtype in (("Llama-3.1-8B-Instruct", "llama"), ("Qwen2.5-7B-Instruct", "qwen2"), ("DeepSeek-V3", "deepseek_v3"), (ASSISTANT, "gemma4_assistant")):
        with case(mtype):
            flag_refuses(subject, argv_for(model, FLAG, "--attention-backend", "triton"), f"{FLAG} on {mtype}",
                         (FLAG, mtype, "Gemma-4"))


@contract(
    "VAL-REJECT-NON-TRITON", f"{SEED}, Behaviour: 'When set ... with a non-triton backend ... clear ValueError at startup'", rules=("F8",), options=BACKEND_OPTIONS,
)
def reject_non_triton(subject) -> None:
    """Flag on with a prefill (or general) attention backend other than triton is a ValueError naming the backend
    flag."""
    require_option(subject, FLAG)
    for flag in ("--attention-backend", "--prefill-attention-backend"):
        for backend in ("torch_native", "flashinfer", "fa3"):
            with case(f"{flag} {backend}"):
                flag_refuses(subject, argv_for(E2B, FLAG, flag, backend), f"{FLAG} with {flag} {backend}",
                             (FLAG, flag, backend, "triton"))
    # Decode-only choice does not touch prefill: accepted.
    with case("--decode-attention-backend torch_native"):
        flag_keeps(subject, argv_for(E2B, FLAG, "--decode-attention-backend", "torch_native"),
                   f"{FLAG} with only --decode-attention-backend torch_native")


@contract(
    "RES-UNSET-BACKEND-TRITON", f"{SEED}, Behaviour: triton-backend pin (Gemma-4 branch validators)", rules=("F8",), options=BACKEND_OPTIONS,
)
def unset_backend_resolves_triton(subject) -> None:
    """Flag on with no attention backend given resolves the backend to triton as a declared, logged resolution."""
    require_option(subject, FLAG)
    out = flag_keeps(subject, argv_for(E2B, FLAG), f"{FLAG} on E2B with no backend given")
    expect_equal(out.user.get("attention_backend"), None, "the user's attention_backend (resolving view)")
    expect_equal(out.resolved.get("attention_backend"), "triton", "resolved attention_backend")
    decl = [r for r in out.resolutions if r[1] == "attention_backend" and r[2] == "triton"]
    require(decl, f"the change to triton must be a declared resolution; declared: {out.resolutions}")
    logged = [m for _, m in out.log if "attention_backend" in m and "triton" in m]
    require(logged, "the resolution to triton must appear in the startup log")
    require(
        any(_is_enabled_line(m, 20) for _, m in out.log),
        "after resolving to triton the fast-prefill INFO line must be logged",
    )


@contract(
    "VAL-REJECT-NO-SHARED-LAYERS", f"{SEED}, Behaviour: 'When set ... with num_kv_shared_layers == 0: clear ValueError at startup'", rules=("F9",), options=ONLY_FLAG,
)
def reject_no_shared_layers(subject) -> None:
    """Flag on with a model whose num_kv_shared_layers == 0 is a ValueError naming the flag and num_kv_shared_layers."""
    require_option(subject, FLAG)
    flag_refuses(subject, argv_for(DENSE31B, FLAG, "--attention-backend", "triton"), f"{FLAG} on {DENSE31B} (0 shared layers)",
                 (FLAG, "num_kv_shared_layers"))


def _reject_algo(subject, algo: str) -> None:
    require_option(subject, FLAG)
    for extra in ((), ("--attention-backend", "triton")):
        with case(f"{algo} {' '.join(extra)}"):
            flag_refuses(subject, argv_for(E2B, FLAG, "--speculative-algorithm", algo, *extra),
                         f"{FLAG} with --speculative-algorithm {algo}", (FLAG, algo, "--speculative-algorithm"))
    # Not a case of its own: it cannot pass the rule alone when every case with the flag was inconclusive.
    out = subject.check(argv_for(E2B, "--speculative-algorithm", algo, "--attention-backend", "triton"))
    if out.error is not None:
        require(not _mentions_fast_prefill(str(out.error)), f"{algo} without the flag must not be refused for fast prefill")


@contract(
    "VAL-REJECT-EAGLE", f"{SEED}, Behaviour: 'When set with --speculative-algorithm EAGLE or EAGLE3: clear ValueError'", rules=("F10",), options=SPEC_OPTIONS,
)
def reject_eagle(subject) -> None:
    """Flag on with --speculative-algorithm EAGLE is a ValueError (EAGLE needs per-token logits)."""
    _reject_algo(subject, "EAGLE")


@contract(
    "VAL-REJECT-EAGLE3", f"{SEED}, Behaviour: 'When set with --speculative-algorithm EAGLE or EAGLE3: clear ValueError'", rules=("F11",), options=SPEC_OPTIONS,
)
def reject_eagle3(subject) -> None:
    """Flag on with --speculative-algorithm EAGLE3 is a ValueError (EAGLE3 needs per-token logits)."""
    _reject_algo(subject, "EAGLE3")


@contract(
    "SPEC-NEXTN-ACCEPTED", f"{SEED}, Behaviour: 'When set with --speculative-algorithm NEXTN (which Gemma-4 promotes to FROZEN_KV_MTP ...): accepted'", rules=("F12",), options=SPEC_OPTIONS,
)
def nextn_accepted(subject) -> None:
    """Flag on with --speculative-algorithm NEXTN and a Gemma-4 assistant draft is accepted and promoted to
    FROZEN_KV_MTP with an INFO line."""
    require_option(subject, FLAG)
    for flags in ((FLAG,), (FLAG, "--attention-backend", "triton"), ()):
        with case(" ".join(flags) or "without the flag"):
            argv = argv_for(E2B, *flags, "--speculative-algorithm", "NEXTN", draft=ASSISTANT)
            out = flag_keeps(subject, argv, f"NEXTN with a Gemma-4 assistant draft, flags {flags}")
            expect_equal(out.user.get("speculative_algorithm"), "NEXTN", "the user's speculative_algorithm")
            expect_equal(out.resolved.get("speculative_algorithm"), "FROZEN_KV_MTP", "resolved speculative_algorithm")
            info = [m for lv, m in out.log if lv == "INFO" and "NEXTN" in m and "FROZEN_KV_MTP" in m and "promot" in m.lower()]
            require(len(info) == 1, f"expected one INFO line saying NEXTN is promoted to FROZEN_KV_MTP; log was {out.log}")


@contract(
    "SPEC-NEXTN-NEEDS-ASSISTANT", f"{SEED}, Behaviour: NEXTN promoted to FROZEN_KV_MTP for the assistant draft", rules=("F12",), options=SPEC_OPTIONS,
)
def nextn_needs_assistant(subject) -> None:
    """NEXTN with a draft that is not a Gemma-4 assistant (or no draft) is a ValueError saying NEXTN is implemented
    only as FROZEN_KV_MTP."""
    require_option(subject, FLAG)
    for draft in ("Llama-3.1-8B-Instruct", E2B, None):
        with case(f"draft {draft}"):
            out = subject.check(argv_for(E2B, FLAG, "--speculative-algorithm", "NEXTN", draft=draft))
            expect_rejected(out, f"NEXTN with draft {draft}", mentions=("NEXTN", "FROZEN_KV_MTP", "--speculative-draft-model-path"))
