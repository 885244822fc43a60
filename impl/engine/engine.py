"""Engine: the offline API (SGLang's shape) over one step-wise scheduler.

``Engine(model_path=None, **server_args)`` checks and resolves the server
arguments, loads the model, sizes the KV pool and logs the startup lines.
``generate`` drives ``Scheduler.step()`` on the caller's thread until its
requests finish; ``start_background_loop()`` instead runs the loop on a thread
(the HTTP server's mode), and ``submit`` / ``abort`` are safe from any thread:
each request gets a ``RequestHandle`` whose queue receives its output dicts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator, Sequence

import torch

from impl.args.attention import device_of
from impl.args.check import check_server_args
from impl.args.platform import Platform
from impl.args.resolution import resolutions_of
from impl.args.server_args import ServerArgs
from impl.args.unsupported import refuse_unimplemented
from impl.cache.allocator import TokenSlotAllocator
from impl.cache.radix_cache import RadixCache
from impl.config.model_config import ModelConfig
from impl.engine.kv_lifecycle import KVLifecycle
from impl.engine.model_runner import ModelRunner
from impl.engine.output import build_output
from impl.engine.req import Req
from impl.engine.scheduler import Scheduler, SchedulerConfig
from impl.sampling.sampling_params import SamplingParams

logger = logging.getLogger("impl.engine")

# --chunked-prefill-size unset: SGLang's default on GPUs; smaller on CPU, where a
# long chunk would stall the decode steps batched with it.
DEFAULT_CHUNKED_PREFILL = {"cuda": 8192, "cpu": 2048}


@dataclass
class RequestHandle:
    """One submitted request: its output dicts arrive on ``queue`` (the last has a finish_reason)."""

    rid: str
    stream: bool
    queue: "queue.Queue[dict[str, Any]]" = field(default_factory=queue.Queue)
    final: dict[str, Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Engine:
    def __init__(self, model_path: str | None = None, **kwargs: Any):
        if model_path is None:
            from impl.testing.checkpoints import default_model_path

            model_path = default_model_path()
        names = {f.name for f in dataclasses.fields(ServerArgs)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ValueError(f"Engine got unknown server argument(s) {unknown}; see ServerArgs for the valid names")
        if kwargs.get("dp_size", 1) != 1:
            raise ValueError(f"--dp-size {kwargs['dp_size']}: an Engine is one replica; data-parallel replicas run "
                             "behind the HTTP server (python -m impl.launch_server --dp-size N)")
        self.server_args = ServerArgs(model_path=model_path, **kwargs)
        platform = Platform.detect(self.server_args.device)
        model_config = ModelConfig.from_server_args(self.server_args)
        check_server_args(self.server_args, model_config, platform)
        refuse_unimplemented(self.server_args)
        args = self.server_args.resolved()
        self.resolved_args = args
        self.device = torch.device(device_of(self.server_args))
        self.model_config = model_config.with_fast_prefill(bool(args.kv_sharing_fast_prefill))
        self.runner = ModelRunner(args, self.model_config, self.device)
        self.tokenizer = _load_tokenizer(args.tokenizer_path or model_path)
        chunk = args.chunked_prefill_size
        if chunk is None:
            chunk = DEFAULT_CHUNKED_PREFILL[self.device.type if self.device.type == "cuda" else "cpu"]
        if chunk == 0 or chunk < -1:
            raise ValueError(f"--chunked-prefill-size must be -1 (off) or a positive token count, got {chunk}")
        self.scheduler_config = SchedulerConfig(
            max_running_requests=self.runner.limits.max_running_requests,
            chunked_prefill_size=chunk,
            max_prefill_tokens=args.max_prefill_tokens,
            max_req_len=self.runner.limits.max_req_len,
            eos_token_ids=self._eos_ids(),
            vocab_size=self.model_config.vocab_size,
            stream_interval=max(1, args.stream_interval),
            schedule_policy=args.schedule_policy,
        )
        allocator = TokenSlotAllocator(self.runner.token_to_kv_pool.capacity)
        tree = None if args.disable_radix_cache else RadixCache(allocator)
        kv = KVLifecycle(allocator, self.runner.req_to_token_pool, tree)
        self.scheduler = Scheduler(self.scheduler_config, self.runner, kv, self._decode)
        seed = args.random_seed if args.random_seed is not None else int(torch.randint(0, 2**62, (1,)))
        self._seed_gen = torch.Generator().manual_seed(seed)
        self._step_lock = threading.Lock()
        self._submit_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.startup_log = self.runner.describe() + [
            f"Chunked prefill: {'off' if chunk == -1 else f'{chunk} tokens'}"
            + ("" if args.chunked_prefill_size is not None else " (default)")
            + f"; radix cache {'off' if tree is None else 'on'}",
        ]
        if "triton" in self.runner.backend_names:
            from impl.kernels.triton_env import triton_startup_warning

            warning = triton_startup_warning()
            if warning:
                self.startup_log.append(warning)
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
    ):
        """One request -> a dict (a list of n dicts when n > 1); a batch -> a list of dicts
        (prompt-major when n > 1). ``stream=True`` -> an iterator of cumulative dicts."""
        handles, single = self._submit_request(
            prompt, sampling_params, input_ids, return_logprob, logprob_start_len, top_logprobs_num, stream, rid
        )
        if stream:
            return self._stream(handles)
        self._drive_until(lambda: all(h.done.is_set() for h in handles))
        outs = [h.final for h in handles]
        return outs[0] if single and len(outs) == 1 else outs

    async def async_generate(self, *args: Any, stream: bool = False, **kwargs: Any):
        """``generate`` without blocking the event loop; with ``stream=True`` an async iterator."""
        if stream:
            return self._async_stream(self.generate(*args, stream=True, **kwargs))
        return await asyncio.get_running_loop().run_in_executor(None, lambda: self.generate(*args, **kwargs))

    async def _async_stream(self, it: Iterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        sentinel = object()
        while True:
            item = await loop.run_in_executor(None, next, it, sentinel)
            if item is sentinel:
                return
            yield item

    def _stream(self, handles: list[RequestHandle]) -> Iterator[dict[str, Any]]:
        pending = list(handles)
        try:
            while pending:
                for h in list(pending):
                    while True:
                        try:
                            out = h.queue.get_nowait()
                        except queue.Empty:
                            break
                        yield out
                        if out["meta_info"]["finish_reason"] is not None:
                            pending.remove(h)
                            break
                if pending:
                    self._drive_until(lambda: any(not h.queue.empty() for h in pending))
        finally:
            for h in pending:  # the consumer stopped early: do not leave the request running
                self.abort(h.rid)

    # ---- thread-safe request API (used by the HTTP server) -----------------------------------
    def submit(self, req: Req, stream: bool = False) -> RequestHandle:
        """Validate and enqueue a prepared Req; raises ValueError for an unservable request."""
        self.scheduler.validate(req)
        handle = RequestHandle(req.rid, stream)
        req.on_output = lambda r, h=handle: self._on_output(h, r)
        self.scheduler.add_request(req)
        self._wake.set()
        return handle

    def abort(self, rid: str | None = None) -> None:
        """Abort a request by id (None: every request); its handle receives finish_reason abort."""
        self.scheduler.abort_request(rid)
        self._wake.set()
        if self._thread is None:
            with self._step_lock:
                self.scheduler.process_inbox()

    def make_req(
        self,
        input_ids: list[int],
        sampling_params: SamplingParams | dict | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        rid: str | None = None,
    ) -> Req:
        sp = SamplingParams.from_dict(sampling_params)
        seed = sp.seed if sp.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._seed_gen))
        start = -1 if logprob_start_len is None else int(logprob_start_len)
        return Req(
            rid=rid or uuid.uuid4().hex,
            origin_input_ids=[int(t) for t in input_ids],
            sampling_params=sp,
            return_logprob=bool(return_logprob),
            logprob_start_len=start if return_logprob else -1,
            top_logprobs_num=int(top_logprobs_num or 0) if return_logprob else 0,
            generator=torch.Generator().manual_seed(seed),
        )

    def _on_output(self, handle: RequestHandle, req: Req) -> None:
        if not (handle.stream or req.is_finished):
            return
        out = build_output(req, self._decode)
        if req.is_finished:
            handle.final = out
        handle.queue.put(out)
        if req.is_finished:
            handle.done.set()

    def _submit_request(self, prompt, sampling_params, input_ids, return_logprob, logprob_start_len, top_logprobs_num,
                        stream, rid) -> tuple[list[RequestHandle], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompt or input_ids")
        if prompt is not None:
            single = isinstance(prompt, str)
            prompts = [prompt] if single else list(prompt)
            if not all(isinstance(p, str) for p in prompts):
                raise ValueError("prompt must be a string or a list of strings")
            ids_list = [self.encode(p) for p in prompts]
        else:
            single = not input_ids or not isinstance(input_ids[0], (list, tuple))
            ids_list = [list(input_ids)] if single else [list(x) for x in input_ids]
        b = len(ids_list)
        if b == 0:
            raise ValueError("the batch is empty")

        def per(x: Any, name: str) -> list[Any]:
            if isinstance(x, (list, tuple)) and not (name == "sampling_params" and isinstance(x, SamplingParams)):
                if len(x) != b:
                    raise ValueError(f"{name} has {len(x)} entries for a batch of {b} requests")
                return list(x)
            return [x] * b

        sps = [SamplingParams.from_dict(s) for s in per(sampling_params, "sampling_params")]
        rets, starts, tops = per(return_logprob, "return_logprob"), per(logprob_start_len, "logprob_start_len"), per(
            top_logprobs_num, "top_logprobs_num"
        )
        rids = per(rid, "rid") if rid is not None else [None] * b
        reqs = []
        for i in range(b):
            base = rids[i] or uuid.uuid4().hex
            for j in range(sps[i].n):
                sp = dataclasses.replace(sps[i], n=1)
                if sp.seed is not None:
                    sp.seed += j
                reqs.append(self.make_req(ids_list[i], sp, rets[i], starts[i], tops[i], base if sps[i].n == 1 else f"{base}-{j}"))
        for r in reqs:
            self.scheduler.validate(r)
        with self._submit_lock:
            handles = [self.submit(r, stream) for r in reqs]
        return handles, single

    # ---- the loop ---------------------------------------------------------------------
    def step(self) -> bool:
        """Run one scheduler step (one forward at most) on this thread."""
        with self._step_lock:
            return self.scheduler.step()

    def _drive_until(self, done, steps: int | None = None) -> None:
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
                raise RuntimeError("scheduler went idle with requests unfinished (engine bug)")

    def start_background_loop(self) -> None:
        """Run the scheduler on a daemon thread (the HTTP server's mode)."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopping:
            try:
                busy = self.step()
            except Exception:  # noqa: BLE001 - one bad batch must not take the server down
                # The failed forward's requests cannot be resumed safely: abort every
                # in-flight request (their clients get finish_reason abort) and keep serving.
                logger.exception("Scheduler step failed; aborting in-flight requests")
                self.scheduler.abort_request(None)
                busy = True
            if not busy:
                self._wake.wait(0.05)
                self._wake.clear()

    def is_alive(self) -> bool:
        """True while the background scheduler thread runs."""
        return self._thread is not None and self._thread.is_alive()

    # ---- control and introspection -------------------------------------------------------
    def flush_cache(self) -> bool:
        with self._step_lock:
            return self.scheduler.flush_cache()

    def check_integrity(self) -> None:
        with self._step_lock:
            self.scheduler.check_integrity()

    def work_counters(self) -> dict[str, int]:
        return self.runner.work.as_dict()

    def last_work_counters(self) -> dict[str, int]:
        return self.runner.last_work.as_dict()

    def reset_work_counters(self) -> None:
        self.runner.work.reset()

    def get_server_info(self) -> dict[str, Any]:
        import impl

        info = dict(self.resolved_args.user_dict())
        info.update(
            version=impl.__version__,
            resolutions=[r.describe() for r in resolutions_of(self.server_args)],
            max_total_num_tokens=self.runner.budget.num_tokens,
            kv_bytes_per_token=self.runner.token_to_kv_pool.bytes_per_token,
            num_kv_layers=self.runner.token_to_kv_pool.num_kv_layers,
            chunked_prefill_size=self.scheduler_config.chunked_prefill_size,
            max_running_requests=self.scheduler_config.max_running_requests,
            startup_log=list(self.startup_log),
            work_counters=self.work_counters(),
        )
        return info

    def shutdown(self) -> None:
        self.abort(None)
        if self._thread is not None:
            self._stopping = True
            self._wake.set()
            self._thread.join(timeout=10)
            self._thread = None
        with self._step_lock:
            self.scheduler.process_inbox()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ---- text ---------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def _decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _eos_ids(self) -> tuple[int, ...]:
        ids = set(self.model_config.eos_token_ids)
        ids.update(getattr(self.tokenizer, "eos_token_ids", ()) or ())
        return tuple(sorted(ids))


def _load_tokenizer(path: str):
    from impl.model.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(path)
