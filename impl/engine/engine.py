"""Engine: the offline API (SGLang's shape) over one step-wise scheduler.

``Engine(model_path, **server_args)`` checks and resolves the server
arguments, loads the model, sizes the KV pool and logs the startup lines.
``generate`` drives ``Scheduler.step()`` on the caller's thread until its
requests finish; ``start_background_loop()`` instead runs the loop on a thread
(the HTTP server's mode). The async API over the same engine is
``impl.server.async_engine.AsyncEngine``.

Request path: ``expand_requests`` (``impl/engine/intake.py``: batch x ``n``,
the ``seed + j`` rule, the one validation) -> ``submit`` (thread-safe; one
``RequestHandle`` per request) -> the scheduler thread runs forwards and hands
each emission to the detokenizer stage (``impl/engine/detokenizer_stage.py``),
which builds typed ``ReqOutput`` objects (``impl/engine/output.py``) on its own
thread and queues them on the handle. ``generate`` returns SGLang's dicts
(``output.sglang_dict`` / ``SGLangDicts``). ``load()`` is the typed load view (running,
waiting, KV tokens, token budget) for the server, metrics and contract adapters.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import torch

from impl.args.attention import device_of
from impl.args.check import check_server_args
from impl.args.platform import Platform
from impl.args.resolution import resolutions_of
from impl.args.server_args import ServerArgs
from impl.args.unsupported import refuse_unimplemented
from impl.attention.triton_providers import attention_kernels_of, kernel_startup_lines
from impl.cache.allocator import SWATokenSlotAllocator, TokenSlotAllocator
from impl.cache.radix_cache import RadixCache
from impl.cache.swa_pool import HybridSWAKVPool
from impl.cache.swa_radix_cache import SWARadixCache
from impl.config.model_config import ModelConfig
from impl.constrained.grammar import GrammarBackend, GrammarKey
from impl.constrained.limits import InvalidGrammar
from impl.engine import control
from impl.engine.allocator import keep_freed_memory
from impl.engine.detokenizer import IncrementalDetokenizer
from impl.engine.detokenizer_stage import DetokenizerStage, Emission
from impl.engine.intake import TEXT_BOUND_SLACK, IntakePolicy, InvalidRequest, expand_requests
from impl.engine.kv_lifecycle import KVLifecycle
from impl.engine.load import LoadView
from impl.engine.model_runner import ModelRunner
from impl.engine.output import ReqOutput, SGLangDicts, TokenText, sglang_dict
from impl.engine.profiler import ProfileRequest, StepProfiler
from impl.engine.req import Req
from impl.engine.step_lock import StepLock
from impl.engine.request_handle import RequestHandle
from impl.engine.scheduler import Scheduler
from impl.engine.scheduler_config import DecodeStepTimes, SchedulerConfig
from impl.engine.speculative import build_spec_worker
from impl.kernels import cpu_attn

logger = logging.getLogger("impl.engine")


class EngineUnhealthyError(RuntimeError):
    """The engine refuses work: a KV integrity check failed (the reason says which); restart it."""

# --chunked-prefill-size unset: SGLang's default on GPUs; smaller on CPU, where a
# long chunk would stall the decode steps batched with it.
DEFAULT_CHUNKED_PREFILL = {"cuda": 8192, "cpu": 2048}


__all__ = ["Engine", "RequestHandle", "ReqOutput", "InvalidRequest"]


class Engine:
    def __init__(self, model_path: str | None = None, **kwargs: Any):
        names = {f.name for f in dataclasses.fields(ServerArgs)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ValueError(f"Engine got unknown server argument(s) {unknown}; see ServerArgs for the valid names")
        if kwargs.get("dp_size", 1) != 1:
            raise ValueError(f"--dp-size {kwargs['dp_size']}: an Engine is one replica; data-parallel replicas run "
                             "behind the HTTP server (python -m impl.launch_server --dp-size N)")
        if model_path is None:
            raise ValueError(
                "Engine needs a model_path (a Gemma-4 checkpoint directory); python -m impl.launch_server "
                "without --model-path serves the embedded tiny model (impl.models_builtin.default_model_path())."
            )
        self.server_args = ServerArgs(model_path=model_path, **kwargs)
        # torch threads the background scheduler thread runs the forwards with (see start_background_loop)
        self.scheduler_torch_threads = torch.get_num_threads()
        platform = Platform.detect(self.server_args.device)
        model_config = ModelConfig.from_server_args(self.server_args)
        check_server_args(self.server_args, model_config, platform)
        refuse_unimplemented(self.server_args)
        args = self.server_args.resolved()
        self.resolved_args = args
        self.device = torch.device(device_of(self.server_args))
        self.model_config = model_config.with_fast_prefill(bool(args.kv_sharing_fast_prefill))
        chunk = args.chunked_prefill_size
        if chunk is None:
            chunk = DEFAULT_CHUNKED_PREFILL[self.device.type if self.device.type == "cuda" else "cpu"]
        if chunk == 0 or chunk < -1:
            raise ValueError(f"--chunked-prefill-size must be -1 (off) or a positive token count, got {chunk}")
        self.runner = ModelRunner(args, self.model_config, self.device, chunked_prefill_size=chunk)
        self.tokenizer = _load_tokenizer(args.tokenizer_path or model_path)
        kv, max_req_len = _kv_lifecycle(self.runner, args.disable_radix_cache, chunk)
        for backend in (self.runner.prefill_backend, self.runner.decode_backend):
            if hasattr(backend, "keep_decode_packings"):  # the triton backend (the CPU kernels act on it)
                backend.keep_decode_packings = True  # the engine's allocator hands out every slot written to
        self.scheduler_config = SchedulerConfig(
            max_running_requests=self.runner.limits.max_running_requests,
            chunked_prefill_size=chunk,
            max_prefill_tokens=args.max_prefill_tokens,
            max_req_len=max_req_len,
            eos_token_ids=self._eos_ids(),
            vocab_size=self.model_config.vocab_size,
            stream_interval=max(1, args.stream_interval),
            schedule_policy=args.schedule_policy,
        )
        tree = kv.tree
        self.spec_worker = build_spec_worker(args, self.runner)
        self.scheduler = Scheduler(self.scheduler_config, self.runner, kv, spec=self.spec_worker)
        # constrained decoding: compiles on the callers' threads (never the scheduler's), token table on first use
        self.grammar_backend = GrammarBackend(self.tokenizer, self.model_config.vocab_size, self._eos_ids())
        self.intake_policy = IntakePolicy(self.scheduler_config.max_req_len, self.model_config.vocab_size,
                                          allow_auto_truncate=bool(args.allow_auto_truncate))
        # an output that cannot be built fails its request: the stage delivers the error, the scheduler frees it
        self._detokenizer = DetokenizerStage(on_failed=self.abort)
        seed = args.random_seed if args.random_seed is not None else int(torch.randint(0, 2**62, (1,)))
        self._seed_gen = torch.Generator().manual_seed(seed)
        self._step_lock = StepLock()
        self.profiler = StepProfiler(lambda: self.runner.work.forwards)  # /start_profile, /stop_profile
        self.paused: str | None = None  # /pause_generation's mode while paused: no forward runs
        self.weight_version = "default"  # SGLang's: named by update_weights_from_disk's weight_version
        self.weights_path = self.server_args.model_path  # where the served weights were last loaded from
        self._submit_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.startup_log = self.runner.describe() + [
            f"Chunked prefill: {'off' if chunk == -1 else f'{chunk} tokens'}"
            + ("" if args.chunked_prefill_size is not None else " (default)")
            + f"; radix cache {'off' if tree is None else 'on'}",
        ] + ([self.spec_worker.describe()] if self.spec_worker else [])
        self.attention_kernels = attention_kernels_of(self.runner.prefill_backend, self.runner.decode_backend)
        self.startup_log += kernel_startup_lines(self.runner.prefill_backend, self.runner.decode_backend)
        if self.device.type == "cpu":
            self.startup_log.append(keep_freed_memory())
        for line in self.startup_log:
            logger.info(line)

    # ---- generation ---------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
        stream: bool = False,
        rid: str | list[str] | None = None,
        return_text_in_logprobs: bool = False,
    ):
        """One request -> a dict (a list of n dicts when n > 1); a batch -> a list of dicts
        (prompt-major when n > 1). ``stream=True`` -> an iterator of cumulative dicts. ``return_text_in_logprobs``
        (SGLang's): each logprob entry's third slot is its token's text."""
        ids_list, single = self.tokenize_prompts(prompt, input_ids)
        reqs = self.expand_requests(ids_list, sampling_params, return_logprob, logprob_start_len, top_logprobs_num, rid)
        handles = self.submit(reqs, stream)
        tt = TokenText(self.tokenizer.decode) if return_text_in_logprobs else None
        if stream:
            return self._stream(handles, tt)
        self._drive_until(lambda: all(h.done.is_set() for h in handles))
        outs = [sglang_dict(h.result(), tt) for h in handles]
        return outs[0] if single and len(outs) == 1 else outs

    def _stream(self, handles: list[RequestHandle], tt: TokenText | None = None) -> Iterator[dict[str, Any]]:
        pending = list(handles)
        dicts = {id(h): SGLangDicts(token_text=tt) for h in handles}
        try:
            while pending:
                for h in list(pending):
                    while True:
                        try:
                            out = h.queue.get_nowait()
                        except queue.Empty:
                            break
                        yield dicts[id(h)].add(out)
                        if out.finished:
                            pending.remove(h)
                            break
                if pending:
                    self._drive_until(lambda: any(not h.queue.empty() for h in pending))
        finally:
            for h in pending:  # the consumer stopped early: do not leave the request running
                self.abort(h.rid)

    # ---- intake: the one path from arguments to validated requests -------------------------
    def tokenize_prompts(self, prompt: str | list[str] | None, input_ids: list[int] | list[list[int]] | None
                         ) -> tuple[list[list[int]], bool]:
        """(token ids per prompt, whether one prompt was given as a scalar) of ``generate``'s arguments."""
        if (prompt is None) == (input_ids is None):
            raise InvalidRequest("pass exactly one of prompt or input_ids", "input_ids")
        if prompt is not None:
            single = isinstance(prompt, str)
            given: list[object] = [prompt] if isinstance(prompt, str) else list(prompt)
            texts = [p for p in given if isinstance(p, str)]
            if len(texts) != len(given):
                raise InvalidRequest("prompt must be a string or a list of strings", "prompt")
            return [self.encode_prompt(p) for p in texts], single
        assert input_ids is not None  # exactly one of the two was given
        rows: list[Any] = list(input_ids)
        single = not rows or not isinstance(rows[0], (list, tuple))
        return ([rows] if single else [list(x) for x in rows]), single

    def expand_requests(self, input_ids: Sequence[Sequence[int]], *args: Any, grammar_field: str | None = None,
                        **kwargs: Any) -> list[Req]:
        """A batch of prompts -> validated Reqs (B x n, prompt-major): ``intake.expand_requests``
        (same arguments after ``input_ids``) with this engine's limits and seed generator; constrained requests
        get their matchers (``attach_grammars``; ``grammar_field`` names the API field in a refusal)."""
        reqs = expand_requests(input_ids, *args, policy=self.intake_policy, seed_generator=self._seed_gen, **kwargs)
        self.attach_grammars(reqs, grammar_field)
        return reqs

    def attach_grammars(self, reqs: Sequence[Req], field: str | None = None) -> None:
        """Give each constrained request its own matcher (``n`` choices: one each), compiling the grammar here on
        the caller's thread (cached by source). InvalidRequest names ``field`` (default: the sampling field)."""
        for req in reqs:
            g = req.sampling_params.grammar
            if g is None:
                continue
            kind, source = g
            try:
                req.grammar = self.grammar_backend.new_state(GrammarKey(kind, source), field)
            except InvalidGrammar as e:
                raise InvalidRequest(str(e), e.field) from None

    def encode_prompt(self, text: str, add_special_tokens: bool = True, keep: int | None = None,
                      keep_last: bool = True) -> list[int]:
        """A prompt's token ids; a text that cannot fit the context is refused before it is tokenized
        (``IntakePolicy.check_text``), or, under --allow-auto-truncate, cut to what can hold the context
        (``expand_requests`` then cuts the token ids). ``keep`` (vLLM's truncate_prompt_tokens): only that many
        tokens, the last (``keep_last``) or the first, the bos (with ``add_special_tokens``) still first; only
        the end (or start) of the text that can hold them is tokenized."""
        chars = self.tokenizer.max_token_chars
        if keep is None:
            self.intake_policy.check_text(len(text), chars)
            return list(self.tokenizer.encode(text[: self.intake_policy.text_budget(chars)], add_special_tokens))
        span = TEXT_BOUND_SLACK * chars * keep  # characters that hold more than ``keep`` tokens
        body = text[max(len(text) - span, 0):] if keep_last else text[:span]
        tok = self.tokenizer
        bos = tok.bos_token_id if add_special_tokens and tok.add_bos_token else None
        ids = tok.encode(body, False)
        room = keep - (bos is not None)
        ids = (ids[len(ids) - room:] if room > 0 else []) if keep_last else ids[:room]
        return ([bos] if bos is not None else []) + ids

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    chat_template: str | None = None, continue_final_message: bool = False, **extra: Any) -> list[int]:
        """A conversation's token ids through the chat template (its refusals are InvalidRequest on
        ``messages``), bounded before rendering like ``encode_prompt``. ``extra``: more template variables
        (``tools``: the declarations, counted in the bound)."""
        chars = sum(len(m["content"]) if isinstance(m.get("content"), str) else
                    sum(len(p["text"]) for p in m.get("content") or []) for m in messages)
        chars += len(str(extra)) if extra else 0
        self.intake_policy.check_text(chars, self.tokenizer.max_token_chars)
        try:
            return self.tokenizer.encode_chat(messages, add_generation_prompt, chat_template, continue_final_message,
                                              **extra)
        except ValueError as e:
            raise InvalidRequest(str(e), "messages") from None

    # ---- thread-safe request API (used by the HTTP server) -----------------------------------
    def submit(self, reqs: Sequence[Req], stream: bool = False,
               on_finish: Callable[[Req, ReqOutput], None] | None = None,
               wake: Callable[[], None] | None = None) -> list[RequestHandle]:
        """Enqueue Reqs made by ``expand_requests`` (already validated); one handle each.
        ``on_finish`` / ``wake``: the handles' hooks (see ``RequestHandle``). EngineUnhealthyError once the
        engine is unhealthy (see ``health``)."""
        if self.scheduler.unhealthy is not None:
            raise EngineUnhealthyError(f"the engine is unhealthy ({self.scheduler.unhealthy}); restart the server")
        handles = []
        with self._submit_lock:
            for req in reqs:
                req.detok = IncrementalDetokenizer(self.tokenizer,
                                                   skip_special_tokens=req.sampling_params.skip_special_tokens)
                handle = RequestHandle(req, stream, on_finish=on_finish, wake=wake)
                req.on_output = lambda r, h=handle: self._on_output(h, r)
                self.scheduler.add_request(req)
                handles.append(handle)
        self._wake.set()
        return handles

    def abort(self, rid: str | None = None) -> None:
        """Abort a request by id (None: every request); its handle receives finish_reason abort."""
        self.scheduler.abort_request(rid)
        self._wake.set()
        if self._thread is None:
            with self._step_lock.control():
                self.scheduler.process_inbox()

    def _on_output(self, handle: RequestHandle, req: Req) -> None:
        """Scheduler thread: snapshot the counts, leave the text work to the detokenizer stage."""
        if not (handle.stream or req.is_finished):
            return
        finished = req.finished_time if req.is_finished else None
        self._detokenizer.put(Emission(
            handle=handle,
            num_output=len(req.output_ids),
            num_input_logprobs=len(req.input_token_logprobs),
            finish_reason=req.finished_reason,
            time=finished if finished is not None else time.perf_counter(),
            text=req.detok.text if req.sampling_params.stop else None,
            spec=None if req.spec_verify_ct is None else (req.spec_verify_ct, req.spec_accept_length),
        ))

    # ---- the loop ---------------------------------------------------------------------
    def step(self) -> bool:
        """Run one scheduler step (one forward at most) on this thread."""
        self.profiler.tick()  # starts or ends a trace at this step boundary (on the stepping thread)
        with self._step_lock.step():
            if self.paused is not None:
                self.scheduler.process_inbox()  # new requests wait in the queue, aborts apply; nothing runs
                busy = False
            else:
                busy = self.scheduler.step()
        self.profiler.tick()
        return busy

    def pause_generation(self, mode: str = "abort") -> int:
        """SGLang's: no forward runs until ``continue_generation``; requests that arrive meanwhile wait
        (``impl/engine/control.py``). How many requests it aborted, retracted or (``in_place``) kept."""
        return control.pause(self, mode)

    def continue_generation(self) -> None:
        self.paused = None
        self._wake.set()

    def update_weights_from_disk(self, model_path: str, abort_all_requests: bool = False,
                                 weight_version: str | None = None, flush_cache: bool = True) -> tuple[bool, str, int]:
        """SGLang's: serve another checkpoint's weights from the next step on (``impl/engine/control.py``):
        (success, message, requests paused meanwhile)."""
        return control.update_weights(self, model_path, abort_all_requests, weight_version, flush_cache)

    def start_profile(self, req: ProfileRequest) -> None:
        """Queue a torch profiler trace of the next steps (``impl/engine/profiler.py``); ProfilerStateError when
        one is queued or running."""
        self.profiler.start(req)
        if self._thread is None:
            self.profiler.tick()  # a loopless engine steps on this thread
        self._wake.set()

    def stop_profile(self, timeout: float = 600.0) -> tuple[bool, str]:
        """End the trace and wait until it is written: (True, its path) or (False, why there is none)."""
        return self.profiler.stop(timeout, self._wake.set if self._thread is not None else self.profiler.tick)

    def _drive_until(self, done, steps: int | None = None) -> None:
        if self.paused is not None and self._thread is None:
            raise RuntimeError("the engine is paused (pause_generation); call continue_generation first")
        if self._thread is not None:
            while not done():
                self._wake.set()
                threading.Event().wait(0.001)
            return
        n = 0
        while not done() and (steps is None or n < steps):
            progressed = self.step()
            n += 1
            if not progressed and not done():
                if self.scheduler.has_work:
                    continue
                self._detokenizer.drain()  # the last outputs may still be on their way
                if not done():
                    raise RuntimeError("scheduler went idle with requests unfinished (engine bug)")

    def start_background_loop(self) -> None:
        """Run the scheduler on a daemon thread (the HTTP server's mode), with
        ``scheduler_torch_threads`` torch threads (OpenMP's thread count is per calling thread).

        On CPU the process should run multi-threaded torch work on this thread only: once another
        thread (the main one, loading the model) has had its own OpenMP team, libgomp manages more
        threads than there are cores and stops spinning between parallel regions, and every region of
        the scheduler thread pays a sleep / wake-up (``bench/investigations/bench_thread_team.py``: a 32-row oneDNN
        linear 87 -> 132 us; the serving benchmark ~35% slower). ``impl.server.runtime.build_engine`` therefore leaves the main
        thread with one torch thread and sets ``scheduler_torch_threads``."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        torch.set_num_threads(self.scheduler_torch_threads)
        failures = 0
        while not self._stopping:
            try:
                busy = self.step()
                failures = 0
            except Exception as e:  # noqa: BLE001 - a scheduling bug must not take the server down
                # Forward and per-request failures are handled inside the step (fault_isolation.py);
                # this is a failure of the scheduling itself: fail what it concerns, escalate on repeats.
                failures += 1
                logger.exception("Scheduler step failed (%d in a row)", failures)
                with self._step_lock.control():
                    self.scheduler.recover_from_step_failure(e, failures)
                busy = True
            if not busy:
                self._wake.wait(0.05)
                self._wake.clear()

    def is_alive(self) -> bool:
        """True while the background scheduler thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def health(self) -> str | None:
        """None when healthy, else why not (a stopped loop, or a failed KV integrity check)."""
        if self._thread is not None and not self._thread.is_alive():
            return "the engine's scheduler thread has stopped; see the server log"
        return self.scheduler.unhealthy

    # ---- control and introspection -------------------------------------------------------
    def flush_cache(self) -> bool:
        with self._step_lock.control():
            return self.scheduler.flush_cache()

    def check_integrity(self) -> None:
        with self._step_lock.control():
            self.scheduler.check_integrity()

    def load(self) -> LoadView:
        """Requests running / waiting, KV tokens, token budget (safe from any thread)."""
        sched, cfg = self.scheduler, self.scheduler_config
        return LoadView(
            num_running_reqs=len(sched.running) + (1 if sched.chunked_req is not None else 0),
            num_waiting_reqs=len(sched.waiting),
            kv_tokens_total=sched.kv.capacity - 1,  # slot 0 is the reserved pad slot
            kv_tokens_available=sched.kv.full_available(),
            swa_tokens_total=alloc.swa_capacity - 1 if isinstance(alloc := sched.kv.allocator, SWATokenSlotAllocator) else 0,
            swa_tokens_available=sched.kv.swa_available() if sched.kv.hybrid else 0,
            max_running_requests=cfg.max_running_requests,
            chunked_prefill_size=cfg.chunked_prefill_size,
            max_prefill_tokens=cfg.max_prefill_tokens,
            max_req_len=cfg.max_req_len,
        )

    def work_counters(self) -> dict[str, int]:
        return self.runner.work.as_dict()

    def reset_work_counters(self) -> None:
        self.runner.work.reset()

    def forget_warmup(self) -> None:
        """Totals since startup start after the server warm-up (``impl/engine/warmup.py``)."""
        with self._step_lock.control():
            self.reset_work_counters()
            self.scheduler.decode_times = DecodeStepTimes()
            if self.spec_worker is not None:
                self.spec_worker.stats = type(self.spec_worker.stats)()

    def get_server_info(self) -> dict[str, Any]:
        import impl

        info = dict(self.resolved_args.user_dict())
        info.update(
            version=impl.__version__,
            resolutions=[r.describe() for r in resolutions_of(self.server_args)],
            max_total_num_tokens=self.runner.max_total_num_tokens,
            kv_bytes_per_token=self.runner.token_to_kv_pool.bytes_per_token,
            kv_pools=self.runner.kv_pools(),
            kv_cache_storage=self.runner.kv_cache_dtype_name(),
            num_kv_layers=self.runner.token_to_kv_pool.num_kv_layers,
            chunked_prefill_size=self.scheduler_config.chunked_prefill_size,
            max_running_requests=self.scheduler_config.max_running_requests,
            attention_kernels=dict(self.attention_kernels),
            cpu_linear=self.runner.cpu_linear(),
            cpu_kernels=None if self.runner.cpu_kernels is None else self.runner.cpu_kernels.info(),
            quantization=self.runner.quantization_info(),
            memory=self.runner.memory_info(),
            decode_step_times=self.scheduler.decode_times.as_dict(),
            startup_log=list(self.startup_log),
            work_counters=self.work_counters(),
            paused=self.paused,
            weight_version=self.weight_version,
            weights_path=self.weights_path,
        )
        if self.spec_worker is not None:
            info["speculative"] = self.spec_worker.server_info()
            info["internal_states"] = [{"avg_spec_accept_length": self.spec_worker.stats.avg_accept_length,
                                        **self.spec_worker.stats.as_dict()}]
        return info

    def shutdown(self) -> None:
        self.abort(None)
        if self._thread is not None:
            self._stopping = True
            self._wake.set()
            self._thread.join(timeout=10)
            self._thread = None
        with self._step_lock.control():
            self.scheduler.process_inbox()
        self._detokenizer.drain()
        self._detokenizer.stop()
        self.grammar_backend.shutdown()
        cpu_attn.drop_kept_packings()  # the bf16-pair packings decode kept across steps (they hold copies of our keys)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ---- text ---------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def _eos_ids(self) -> tuple[int, ...]:
        ids = set(self.model_config.eos_token_ids)
        ids.update(getattr(self.tokenizer, "eos_token_ids", ()) or ())
        return tuple(sorted(ids))


def _kv_lifecycle(runner: ModelRunner, disable_radix_cache: bool, chunk: int) -> tuple[KVLifecycle, int]:
    """The slot owners over the runner's pool (one pool, or the hybrid sliding-window pool's two) and the
    longest request they serve."""
    pool, max_req_len = runner.token_to_kv_pool, runner.limits.max_req_len
    if not isinstance(pool, HybridSWAKVPool):
        allocator = TokenSlotAllocator(pool.capacity)
        tree = None if disable_radix_cache else RadixCache(allocator)
        return KVLifecycle(allocator, runner.req_to_token_pool, tree), max_req_len
    window = int(runner.model_config.sliding_window or 0)
    swa_allocator = SWATokenSlotAllocator(pool.capacity, pool.swa_capacity, runner.device)
    pool.register_mapping(swa_allocator.full_to_swa)
    swa_tree = None if disable_radix_cache else SWARadixCache(swa_allocator, window)
    sizing = runner.swa_sizing
    kv = KVLifecycle(swa_allocator, runner.req_to_token_pool, swa_tree, sliding_window=window,
                     swa_cap=None if sizing is None else sizing.cap,
                     eviction_interval=None if sizing is None else sizing.eviction_interval)
    swa_tokens = pool.swa_capacity - 1
    if swa_tokens < window + 1:
        raise ValueError(
            f"the hybrid KV pool's sliding-window budget ({swa_tokens} tokens = --swa-full-tokens-ratio "
            f"{runner.server_args.swa_full_tokens_ratio} x {pool.capacity - 1} full-attention tokens) cannot hold one "
            f"request's window and its next token ({window + 1} tokens); raise --swa-full-tokens-ratio or the KV budget "
            "(--max-total-tokens / --mem-fraction-static), or pass --disable-hybrid-swa-memory."
        )
    if chunk == -1:  # an unchunked prompt takes all its sliding-window slots at once
        max_req_len = min(max_req_len, swa_tokens)
    return kv, max_req_len


def _load_tokenizer(path: str):
    from impl.model.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(path)
