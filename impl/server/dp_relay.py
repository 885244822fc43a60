"""``--dp-size N``, the HTTP side: the front every client talks to, relaying to the replicas.

The front holds no model; the replica processes are ``impl.server.dp_control``'s.

* Generation routes (``/generate``, ``/v1/completions``, ``/v1/chat/completions``, ``/v1/responses``)
  and ``/tokenize``, ``/detokenize`` go whole to one replica, chosen by ``--load-balance-method`` (``round_robin``
  or ``shortest_queue``: fewest requests in flight from this front) among the
  live ranks, or by the body's ``data_parallel_rank`` (what ``sglang-router
  --dp-aware`` sends), or, for a Responses body with ``previous_response_id``, the rank that stored that
  response (each replica stores its own; ``GET`` / ``DELETE /v1/responses/{id}``, its ``input_items`` and
  ``cancel`` ask every rank and answer the holder's reply; a background response's events, ``GET ...?stream=true``,
  are streamed from the holder). Bodies are read within ``--max-request-body-bytes`` (the
  single server's 413 and 415). Responses, streams included, pass through byte
  for byte; a client that disconnects closes the replica connection, so the
  replica aborts the request. A replica that dies mid-request ends it cleanly:
  a 503 error body, or for a stream an error event and ``data: [DONE]``.
* ``/get_load``: one entry per rank (SGLang's shape). ``/health``: 503 naming the
  rank when a replica has exited or is unhealthy. ``/metrics``: the replicas'
  counters and histograms summed, ratio gauges averaged (``merge_metrics``).
  ``/tokenizer_info``, ``/v1/models``, ``/get_model_info``: the first live rank's.
  ``/get_server_info``: rank 0's info with ``dp_size``, the loads summed and a
  per-rank list. ``/abort_request``, ``/flush_cache``, ``/pause_generation`` / ``/continue_generation``,
  ``/update_weights_from_disk`` and ``/start_profile`` / ``/stop_profile`` (one profile id, a trace per rank) go
  to every rank; ``/get_weight_version`` is the first live rank's.
* ``DrainingFront``: the front's uvicorn server; on SIGTERM every replica drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from typing import Any, AsyncIterator
from urllib.parse import quote

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

import impl
from impl.server.dp_control import DataParallelController, Replica
from impl.server.errors import APIError, error_response, install_error_handlers
from impl.server.guards import install_guards
from impl.server.intake import read_body
from impl.server.limits import RequestLimits
from impl.server.runtime import CleanExitServer
from impl.server.streaming import DONE, error_event, until_disconnect

logger = logging.getLogger("impl.server.dp")

GENERATE_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/responses")
TOKENIZER_ROUTES = ("/tokenize", "/detokenize")  # any rank answers them (every rank has the same tokenizer)
# hop-by-hop or recomputed headers that must not be copied from a replica's response
_DROP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"})
# gauges that are ratios: averaged over ranks (every other sample is summed)
_AVERAGED = frozenset({"sglang:token_usage", "sglang:cache_hit_rate"})


def create_dp_app(ctrl: DataParallelController) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        _open_clients(ctrl)
        try:
            yield
        finally:
            await _close_clients(ctrl)

    app = FastAPI(title="yoco-gemma4 (data parallel)", version=impl.__version__, lifespan=lifespan)
    app.state.dp = ctrl
    install_error_handlers(app)
    install_guards(app, ctrl.server_args)  # replicas see the front's requests, not the client's headers
    _add_routes(app, ctrl, RequestLimits.from_args(ctrl.server_args))
    return app


def _open_clients(ctrl: DataParallelController) -> None:
    for r in ctrl.replicas:
        transport = httpx.AsyncHTTPTransport(uds=r.spec.uds)
        # Host "localhost": a replica's browser guard accepts it (the client's headers stay at the front)
        r.client = httpx.AsyncClient(transport=transport, base_url="http://localhost",
                                     timeout=httpx.Timeout(None, connect=10.0),
                                     limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))


async def _close_clients(ctrl: DataParallelController) -> None:
    for r in ctrl.replicas:
        if r.client is not None:
            await r.client.aclose()


def _add_routes(app: FastAPI, ctrl: DataParallelController, limits: RequestLimits) -> None:
    for path in GENERATE_ROUTES + TOKENIZER_ROUTES:
        app.add_api_route(path, _generate_route(ctrl, path, limits), methods=["POST"])

    @app.get("/health")
    @app.api_route("/ping", methods=["GET", "POST"])
    async def health() -> Response:
        for r in ctrl.replicas:
            if not r.alive():
                return error_response(503, r.describe_exit())
        codes = await asyncio.gather(*(_status(r, "/health") for r in ctrl.replicas))
        for r, code in zip(ctrl.replicas, codes):
            if code != 200:
                return error_response(503, f"data-parallel rank {r.rank} is unhealthy (/health answered {code})")
        return Response(status_code=200)

    @app.get("/ready")
    async def ready() -> Response:
        """Ready when every rank is (SGLang's readiness: healthy and not paused)."""
        codes = await asyncio.gather(*(_status(r, "/ready") for r in ctrl.replicas))
        return Response(status_code=200 if codes and all(c == 200 for c in codes) else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        return await _forward(ctrl.pick(), "GET", "/health_generate")

    @app.get("/v1/models")
    @app.get("/v1/models/{model_id:path}")
    @app.get("/get_model_info")
    @app.get("/model_info")
    @app.get("/tokenizer_info")
    @app.get("/get_weight_version")
    async def first_rank(request: Request) -> Response:
        return await _forward(ctrl.pick(ctrl.first_live()), "GET", request.url.path)

    @app.get("/v1/responses/{response_id}")
    @app.delete("/v1/responses/{response_id}")
    @app.get("/v1/responses/{response_id}/input_items")
    @app.post("/v1/responses/{response_id}/cancel")
    async def stored_response(request: Request) -> Response:
        """A stored (or background) response is held by the rank that answered it: every live rank is asked, the
        first answer that is not a 404 is the front's; a GET of its events (``?stream=true``) is streamed from the
        rank that holds it."""
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        live = _live(ctrl)
        if not live:
            return error_response(503, "no data-parallel replica is alive")
        if request.method == "GET" and request.query_params.get("stream", "").lower() in ("true", "1", "yes", "on"):
            rank = await _holder(ctrl, request.url.path)
            if rank is not None:
                return await _stream_from(ctrl.replicas[rank], request, "GET", path, None)
        resps = await asyncio.gather(*(_forward(r, request.method, path) for r in live))
        return next((x for x in resps if x.status_code != 404), resps[0])

    @app.get("/get_load")
    async def get_load() -> list[dict[str, Any]]:
        out = []
        for r, loads in zip(ctrl.replicas, await _gather_json(ctrl, "/get_load")):
            for entry in loads or []:
                out.append({**entry, "dp_rank": r.rank})
        return out

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> JSONResponse:
        return JSONResponse(merge_server_info(ctrl, await _gather_json(ctrl, "/get_server_info")))

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        texts = await asyncio.gather(*(_text(r, "/metrics") for r in _live(ctrl)))
        return PlainTextResponse(merge_metrics([t for t in texts if t is not None]),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await read_body(request, limits)
        resps = await asyncio.gather(*(_forward(r, "POST", "/abort_request", body) for r in _live(ctrl)))
        bad = [x for x in resps if x.status_code != 200]
        return bad[0] if bad else JSONResponse({"success": True})

    @app.api_route("/start_profile", methods=["GET", "POST"])
    async def start_profile(request: Request) -> Response:
        """Every live rank traces its own steps under one profile id, each to its own file (``-DP-<rank>``)."""
        raw = await read_body(request, limits) if request.method == "POST" else b""
        obj = _body_object(raw) if raw.strip() else {}
        if obj is None:
            return error_response(400, "the body must be a JSON object of SGLang's profile fields (or empty)")
        obj.setdefault("profile_id", f"{time.time():.6f}")
        resps = await asyncio.gather(*(_forward(r, "POST", "/start_profile",
                                                json.dumps({**obj, "data_parallel_rank": r.rank}).encode())
                                       for r in _live(ctrl)))
        return _all_or_first_failure(resps)

    @app.api_route("/stop_profile", methods=["GET", "POST"])
    async def stop_profile() -> Response:
        return _all_or_first_failure(await asyncio.gather(*(_forward(r, "POST", "/stop_profile")
                                                            for r in _live(ctrl))))

    @app.post("/pause_generation")
    @app.post("/continue_generation")
    @app.post("/update_weights_from_disk")
    @app.post("/update_weight_version")
    async def on_every_rank(request: Request) -> Response:
        """Every live rank pauses (continues, loads the new weights); the answer counts the requests of all of
        them, or is the first rank's failure."""
        body = await read_body(request, limits)
        resps = await asyncio.gather(*(_forward(r, "POST", request.url.path, body) for r in _live(ctrl)))
        failed = _failure(resps)
        if failed is not None:
            return failed
        answers = [json.loads(bytes(x.body)) for x in resps]
        merged = dict(answers[0])
        for k, v in merged.items():
            if isinstance(v, int) and not isinstance(v, bool):
                merged[k] = sum(a[k] for a in answers)
        return JSONResponse(merged)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> Response:
        path = "/flush_cache" + (f"?{request.url.query}" if request.url.query else "")
        resps = await asyncio.gather(*(_forward(r, "POST", path) for r in _live(ctrl)))
        bad = [x for x in resps if x.status_code != 200]
        return bad[0] if bad else PlainTextResponse("Cache flushed.\n")


def _live(ctrl: DataParallelController) -> list[Replica]:
    return [r for r in ctrl.replicas if r.alive()]


def _failure(resps: list[Response]) -> Response | None:
    """The first rank's answer that is not a 200, or a 503 when no rank answered (none alive); None when every
    rank answered 200."""
    bad = [x for x in resps if x.status_code != 200]
    if bad or not resps:
        return bad[0] if bad else error_response(503, "no data-parallel replica is alive")
    return None


def _all_or_first_failure(resps: list[Response]) -> Response:
    """Every rank's 200 texts joined, or the first rank's failure."""
    failed = _failure(resps)
    return failed if failed is not None else PlainTextResponse("".join(bytes(x.body).decode() for x in resps))


def _body_object(body: bytes) -> dict[str, Any] | None:
    """The body's JSON object; None when it is not one (the replica answers the 400 naming the JSON error)."""
    try:
        obj = json.loads(body) if body else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def _requested_rank(obj: dict[str, Any] | None, n: int) -> int | None:
    """The body's ``data_parallel_rank`` (SGLang's field), validated; None when absent or the body is not JSON."""
    if obj is None or obj.get("data_parallel_rank") is None:
        return None
    rank = obj["data_parallel_rank"]
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
        raise APIError(400, f"invalid value for field 'data_parallel_rank': {rank!r}; this server has --dp-size {n}, "
                            f"so it must be an integer in [0, {n - 1}]", "data_parallel_rank")
    return rank


async def _holder(ctrl: DataParallelController, path: str) -> int | None:
    """The rank whose GET ``path`` answers 200 (the rank that stored a response); None when none does."""
    live = _live(ctrl)
    codes = await asyncio.gather(*(_status(r, path) for r in live))
    return next((r.rank for r, code in zip(live, codes) if code == 200), None)


def _generate_route(ctrl: DataParallelController, path: str, limits: RequestLimits):
    async def route(request: Request) -> Response:
        body = await read_body(request, limits)
        obj = _body_object(body)
        rank = _requested_rank(obj, ctrl.dp_size)
        if rank is None and obj is not None and isinstance(obj.get("previous_response_id"), str):
            rank = await _holder(ctrl, "/v1/responses/" + quote(obj["previous_response_id"], safe=""))
        r = ctrl.pick(rank)
        r.served += 1
        return await _stream_from(r, request, "POST", path, body)

    route.__name__ = "dp_" + path.strip("/").replace("/", "_")
    return route


async def _stream_from(r: Replica, request: Request, method: str, path: str, body: bytes | None) -> Response:
    """``method path`` on replica ``r``, its answer relayed as it comes (counted in ``r.in_flight`` until it ends)."""
    r.in_flight += 1
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            r.in_flight -= 1

    try:
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        req = r.http.build_request(method, path, content=body, headers=headers)
        upstream = await until_disconnect(request, r.http.send(req, stream=True), lambda: None)
        if upstream is None:  # the client left before the replica answered: the cancelled send closed it
            release()
            return Response(status_code=499)
    except httpx.HTTPError as e:
        release()
        return error_response(503, await _died(r, e))
    except BaseException:
        release()
        raise
    return StreamingResponse(_relay(r, upstream, release), status_code=upstream.status_code,
                             headers=_copy_headers(upstream))


async def _relay(r: Replica, upstream: httpx.Response, release) -> AsyncIterator[bytes]:
    is_sse = upstream.headers.get("content-type", "").startswith("text/event-stream")
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    except httpx.HTTPError as e:
        if is_sse:  # headers are gone already: end the stream with an error event
            yield error_event(await _died(r, e), 503)
            yield DONE
    finally:
        release()
        await upstream.aclose()


async def _died(r: Replica, e: Exception) -> str:
    await asyncio.sleep(0.05)  # let a just-killed process be reaped so the message can say so
    what = r.describe_exit() if not r.alive() else f"data-parallel rank {r.rank} dropped the connection"
    return f"{what} while serving this request ({type(e).__name__}); the request was lost, retry it"


def _copy_headers(resp: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.lower() not in _DROP_HEADERS}


async def _forward(r: Replica, method: str, path: str, body: bytes | None = None) -> Response:
    try:
        resp = await r.http.request(method, path, content=body,
                                      headers={"content-type": "application/json"} if body is not None else None)
    except httpx.HTTPError as e:
        return error_response(503, f"data-parallel rank {r.rank}: {type(e).__name__}: {e}")
    return Response(resp.content, status_code=resp.status_code, headers=_copy_headers(resp))


async def _status(r: Replica, path: str) -> int:
    try:
        return (await r.http.get(path, timeout=10.0)).status_code
    except httpx.HTTPError:
        return 503


async def _text(r: Replica, path: str) -> str | None:
    try:
        resp = await r.http.get(path, timeout=10.0)
    except httpx.HTTPError:
        return None
    return resp.text if resp.status_code == 200 else None


async def _gather_json(ctrl: DataParallelController, path: str) -> list[Any]:
    """Each rank's JSON answer to GET ``path`` (None for a dead or failing rank)."""

    async def one(r: Replica) -> Any:
        if not r.alive():
            return None
        try:
            resp = await r.http.get(path, timeout=10.0)
        except httpx.HTTPError:
            return None
        return resp.json() if resp.status_code == 200 else None

    return list(await asyncio.gather(*(one(r) for r in ctrl.replicas)))


def merge_server_info(ctrl: DataParallelController, infos: list[Any]) -> dict[str, Any]:
    """Rank 0's (the first live rank's) info with the loads and work counters summed and a per-rank list."""
    live = [i for i in infos if i]
    if not live:
        raise APIError(503, "no data-parallel replica answered /get_server_info")
    info = dict(live[0])
    for key in ("num_running_reqs", "num_waiting_reqs"):
        info[key] = sum(i.get(key, 0) for i in live)
    info["token_usage"] = sum(i.get("token_usage", 0.0) for i in live) / len(live)
    counters: dict[str, int] = {}
    for i in live:
        for k, v in (i.get("work_counters") or {}).items():
            counters[k] = counters.get(k, 0) + v
    info["work_counters"] = counters
    info.update(dp_size=ctrl.dp_size, load_balance_method=ctrl.server_args.load_balance_method,
                api_key="<redacted>" if ctrl.server_args.api_key else None,
                dp_ranks=[{"dp_rank": r.rank, "pid": r.proc.pid, "alive": r.alive(), "cores": list(r.spec.cores),
                           "requests_served": r.served, "in_flight": r.in_flight} for r in ctrl.replicas])
    return info


def merge_metrics(texts: list[str]) -> str:
    """One Prometheus text from the replicas': samples with the same name and labels are summed (ratio gauges
    in ``_AVERAGED`` are averaged); comments and order come from the first text."""
    if not texts:
        return ""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    order: list[str] = []
    for text in texts:
        for line in text.splitlines():
            if not line:
                continue
            if line.startswith("#"):
                if line not in sums and text is texts[0]:
                    order.append(line)
                continue
            key, _, value = line.rpartition(" ")
            if key not in sums:
                order.append(key)
                sums[key] = 0.0
                counts[key] = 0
            sums[key] += float(value)
            counts[key] += 1
    out = []
    for key in order:
        if key.startswith("#"):
            out.append(key)
            continue
        name = key.partition("{")[0]
        v = sums[key] / counts[key] if name in _AVERAGED else sums[key]
        out.append(f"{key} {int(v) if math.isfinite(v) and v == int(v) and name not in _AVERAGED else v}")
    return "\n".join(out) + "\n"


class DrainingFront(CleanExitServer):
    """The front's server: on SIGTERM / Ctrl-C it stops accepting, SIGTERMs every replica (each gives its
    in-flight requests SHUTDOWN_GRACE_S, then aborts them, so every relayed stream ends) and waits for the
    relays to finish; the process exits 0."""

    def __init__(self, config: uvicorn.Config, ctrl: DataParallelController):
        super().__init__(config)
        self.ctrl = ctrl

    async def shutdown(self, sockets=None) -> None:
        busy = sum(r.in_flight for r in self.ctrl.replicas)
        if busy:
            logger.info("Shutting down: %d request(s) in flight on the replicas get to finish (each replica "
                        "aborts what is left after its grace period)", busy)
        self.ctrl.signal_all()
        await super().shutdown(sockets)
