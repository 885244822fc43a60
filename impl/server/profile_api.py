"""SGLang's ``/start_profile`` and ``/stop_profile`` (GET or POST): a torch profiler trace of the server's steps.

What ``sglang.bench_serving --profile`` sends works as in SGLang: the body (all optional) names ``output_dir``,
``num_steps`` (at most 10,000: a trace left running ends by itself there) / ``start_step`` (integers, or their
decimal strings, as bench_serving sends them), ``activities`` (default ``["CPU", "GPU"]``), ``with_stack`` /
``record_shapes`` (default true), ``profile_id`` (default the time), ``profile_prefix``, ``merge_profiles`` (one rank per process: nothing to merge). The trace is
``<output_dir>/[<prefix>-]<profile_id>-TP-0[-DP-<rank>].trace.json.gz`` (``impl/engine/profiler.py``).

Where this server is stricter: ``output_dir`` (absolute, or relative to it) must lie inside the server's profiler
folder, ``SGLANG_TORCH_PROFILER_DIR`` (default ``/tmp``, SGLang's), since a request must not choose where the
server writes; bench_serving's folder (the client's ``SGLANG_TORCH_PROFILER_DIR`` plus a timestamp) is inside it
when both sides set the variable alike, as SGLang's docs ask. ``GPU`` on a CPU server records nothing more (the
answer says so; it is bench_serving's default), ``MEM`` adds the profiler's memory events to the same trace; the
other activities (``CUDA_PROFILER``, ``XPU``, ``RPD``), ``profile_by_stage``, ``profile_stages`` and
``detailed_annotations`` are 400s naming the field. A second start while one is queued or running and a stop with
none are 400s (SGLang's messages).
"""

from __future__ import annotations

import os
import time
from typing import Annotated, Any, Literal, Optional

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from pydantic import BeforeValidator, Field

from impl.engine.engine import Engine
from impl.engine.profiler import MAX_PROFILE_FORWARDS, ProfileRequest, ProfilerStateError
from impl.envs import envs
from impl.server.errors import APIError
from impl.server.intake import off_loop, read_optional_body
from impl.server.limits import RequestLimits
from impl.server.protocol import I32_MAX, _Body

STOP_TIMEOUT_S = 600.0  # a stop waits for the step in progress, then the export


def _decimal(v: Any) -> Any:
    """bench_serving sends start_step / num_steps as strings of digits."""
    return int(v) if isinstance(v, str) and v.isdigit() and len(v) <= 10 else v


StepsT = Annotated[int, Field(ge=0, le=I32_MAX), BeforeValidator(_decimal)]
NameT = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]


class ProfileBody(_Body):
    output_dir: Optional[Annotated[str, Field(min_length=1, max_length=4096)]] = None
    start_step: Optional[StepsT] = None
    num_steps: Optional[Annotated[int, Field(ge=1, le=MAX_PROFILE_FORWARDS), BeforeValidator(_decimal)]] = None
    activities: Optional[Annotated[list[Literal["CPU", "GPU", "MEM", "CUDA_PROFILER", "XPU", "RPD"]],
                                   Field(max_length=8)]] = None
    with_stack: Optional[bool] = None
    record_shapes: Optional[bool] = None
    profile_id: Optional[NameT] = None
    profile_prefix: Optional[NameT] = None
    merge_profiles: bool = False
    profile_by_stage: Optional[bool] = None
    profile_stages: Optional[list[Any]] = None
    detailed_annotations: Optional[bool] = None
    data_parallel_rank: Optional[Annotated[int, Field(ge=0, le=4096)]] = None  # a --dp-size front's, for the name


def profiler_dir() -> str:
    return os.path.realpath(envs.SGLANG_TORCH_PROFILER_DIR.get())


def profile_request(b: ProfileBody, device_type: str) -> tuple[ProfileRequest, list[str]]:
    """The engine's request for a body, and notes for the answer; APIError (400) for what is not served."""
    for name in ("profile_by_stage", "detailed_annotations"):
        if getattr(b, name):
            raise APIError(400, f"'{name}' is not served: one trace covers every step (prefill and decode); "
                                "leave it out or false", name)
    if b.profile_stages is not None:
        raise APIError(400, "'profile_stages' is not served: one trace covers every step; leave it out",
                       "profile_stages")
    acts = list(b.activities) if b.activities is not None else ["CPU", "GPU"]
    other = [a for a in acts if a not in ("CPU", "GPU", "MEM")]
    if other:
        raise APIError(400, f"activity {other[0]} is not served: this server records CPU (and on CUDA GPU) "
                            "activities and MEM (the profiler's memory events)", "activities")
    notes = []
    if "GPU" in acts and device_type != "cuda":
        notes.append("GPU activities: none on this CPU server (CPU activities recorded)")
    root = profiler_dir()
    out = os.path.realpath(os.path.join(root, b.output_dir) if b.output_dir is not None else root)
    if os.path.commonpath([root, out]) != root:
        raise APIError(400, f"'output_dir' {b.output_dir!r:.300} is outside this server's profiler folder {root} "
                            "(SGLANG_TORCH_PROFILER_DIR): name a folder inside it (absolute or relative to it), or "
                            "start the server with SGLANG_TORCH_PROFILER_DIR set to where traces should go",
                       "output_dir")
    req = ProfileRequest(output_dir=out, profile_id=b.profile_id or f"{time.time():.6f}", prefix=b.profile_prefix or "",
                         dp_rank=b.data_parallel_rank, start_step=b.start_step, num_steps=b.num_steps,
                         with_stack=b.with_stack is not False, record_shapes=b.record_shapes is not False,
                         profile_memory="MEM" in acts, cuda="GPU" in acts and device_type == "cuda")
    return req, notes


def add_profile_routes(app: FastAPI, engine: Engine, limits: RequestLimits) -> None:
    @app.api_route("/start_profile", methods=["GET", "POST"], response_class=PlainTextResponse)
    async def start_profile(request: Request):
        """SGLang's: start a torch profiler trace of the next steps (``impl/server/profile_api.py``)."""
        body = await read_optional_body(request, limits, ProfileBody)
        req, notes = profile_request(body, engine.device.type)
        try:
            engine.start_profile(req)
        except ProfilerStateError as e:
            raise APIError(400, str(e)) from None
        return PlainTextResponse("Start profiling.\n" + "".join(f"{n}.\n" for n in notes)
                                 + f"The trace will be saved to {req.path}\n")

    @app.api_route("/stop_profile", methods=["GET", "POST"], response_class=PlainTextResponse)
    async def stop_profile():
        """SGLang's: end the trace; answers once it is written."""
        try:
            ok, what = await off_loop(lambda: engine.stop_profile(STOP_TIMEOUT_S))
        except ProfilerStateError as e:
            raise APIError(400, str(e)) from None
        except TimeoutError as e:
            raise APIError(503, str(e)) from None
        if not ok:
            raise APIError(400, what)
        return PlainTextResponse(f"Stop profiling. This will take some time.\nThe trace is saved to {what}\n")
