"""The FastAPI app: routes over one Engine whose scheduler runs on a background thread.

``create_app(engine)`` builds the app; the lifespan starts the engine loop on
startup and shuts it down (aborting whatever is left) on exit. Route handlers
only parse, submit and format: the engine does the work on its own thread, so
the event loop is never blocked by a forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse

import impl
from impl.engine.engine import Engine, EngineUnhealthyError
from impl.engine.intake import InvalidRequest
from impl.engine.output import ReqOutput, TokenText
from impl.engine.req import Req
from impl.server import generate_api, openai_api, req_builder, responses_api
from impl.server.async_engine import AsyncEngine, EngineDeadError
from impl.server.cluster_api import add_cluster_routes, flush_when_idle
from impl.server.errors import APIError, error_response, install_error_handlers, parse_json
from impl.server.guards import install_guards
from impl.server.intake import off_loop, read_body
from impl.server.limits import RequestLimits
from impl.server.metrics import Gauges, ServerMetrics
from impl.server.openapi_schema import install_openapi
from impl.server.pause_api import add_pause_routes
from impl.server.profile_api import add_profile_routes
from impl.server.weights_api import add_weights_routes
from impl.server.protocol import RequestModels, request_models
from impl.server.background_responses import BackgroundResponses
from impl.server.response_store import ResponseStore
from impl.server.streaming import json_safe

HEALTH_GENERATE_TIMEOUT_S = 60.0
logger = logging.getLogger("impl.server")


@dataclass
class ServerState:
    engine: Engine
    aengine: AsyncEngine
    metrics: ServerMetrics
    model_name: str
    max_req_len: int
    started: float
    limits: RequestLimits
    models: RequestModels
    responses: ResponseStore  # the Responses API's stored responses
    background: BackgroundResponses  # and its background responses while they run

    @property
    def args(self):
        return self.engine.resolved_args


# sglang-router fills a chat request's missing "model" with this name: it means "no model given".
ROUTER_UNKNOWN_MODEL = "unknown"


def served_model_name(engine: Engine) -> str:
    """--served-model-name, else the model path (SGLang's default)."""
    args = engine.resolved_args
    name = args.served_model_name or args.model_path
    if name is None:  # the launcher always resolves a model path (the embedded default when none is given)
        raise ValueError("no model path: pass --model-path (or --served-model-name)")
    return name


def build_state(engine: Engine) -> ServerState:
    name = served_model_name(engine)
    spec_stats = engine.spec_worker.stats.as_dict if engine.spec_worker is not None else None
    metrics = ServerMetrics(name, Gauges(load=engine.load, work_counters=engine.work_counters, spec_stats=spec_stats))
    log_requests = bool(engine.resolved_args.log_requests)

    def on_finish(req: Req, out: ReqOutput) -> None:  # on the detokenizer thread
        record_finished(metrics, out)
        if log_requests:
            logger.info("Finished request %s: %d prompt tokens %s..., output %s, finish_reason %s", req.rid,
                        len(req.origin_input_ids), req.origin_input_ids[:16], req.output_ids,
                        out.finish_reason.to_json() if out.finish_reason else None)

    aengine = AsyncEngine(engine, on_finish=on_finish)
    max_req_len = engine.load().max_req_len
    limits = RequestLimits.from_args(engine.resolved_args, engine.intake_policy.vocab_size)
    return ServerState(engine, aengine, metrics, name, max_req_len, time.time(), limits, request_models(limits),
                       ResponseStore.from_env(), BackgroundResponses.from_env())


def record_finished(metrics: ServerMetrics, out: ReqOutput) -> None:
    metrics.observe_finished(
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        aborted=out.finish_type == "abort",
        ttft=out.ttft,
        e2e=out.e2e_latency,
    )


def create_app(engine: Engine) -> FastAPI:
    state = build_state(engine)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.aengine.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, state.aengine.shutdown)

    app = FastAPI(title="yoco-gemma4", version=impl.__version__, lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app)

    @app.exception_handler(EngineDeadError)
    @app.exception_handler(EngineUnhealthyError)
    async def _engine_dead(request: Request, exc: Exception):
        return error_response(503, str(exc))

    install_guards(app, state.args)
    _add_routes(app, state)
    m = state.models
    install_openapi(app, {"/generate": m.generate, "/v1/completions": m.completion,
                          "/v1/chat/completions": m.chat, "/abort_request": m.abort, "/tokenize": m.tokenize,
                          "/detokenize": m.detokenize, "/v1/responses": m.responses},
                    streaming={"/generate", "/v1/completions", "/v1/chat/completions", "/v1/responses"})
    return app


def _check_model(state: ServerState, model: str | None) -> None:
    folder = os.path.basename(os.path.normpath(state.args.model_path))
    if model is None or model in (state.model_name, state.args.model_path, folder, "default", ROUTER_UNKNOWN_MODEL):
        return
    raise APIError(400, f"model '{model}' is not served here; the 'model' field must be '{state.model_name}'", "model")


def _checked(state: ServerState, make: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A body's builder (run on the intake pool) that first refuses a body naming a model not served here."""
    def build(b: Any) -> Any:
        _check_model(state, b.model)
        return make(b)
    return build


def _add_routes(app: FastAPI, state: ServerState) -> None:
    aengine, engine = state.aengine, state.engine

    async def body_of(request: Request, model, build=None):
        """Read the body (415 / 413 first), then validate (and build) it on the intake pool."""
        raw = await read_body(request, state.limits)

        def work():
            body = parse_json(raw, model)
            return body, (build(body) if build is not None else None)

        return await off_loop(work)

    @app.get("/health")
    @app.api_route("/ping", methods=["GET", "POST"])  # vLLM's (SageMaker's) name for it
    async def health():
        reason = engine.health()
        if reason is not None:
            return error_response(503, f"unhealthy: {reason}")
        return JSONResponse({"status": "ok"})

    @app.get("/health_generate")
    async def health_generate():
        if engine.paused is not None:  # the probe would wait for /continue_generation
            return error_response(503, f"health_generate: generation is paused ({engine.paused}); "
                                       "POST /continue_generation resumes it")
        bos = engine.tokenizer.bos_token_id
        reqs = engine.expand_requests([[bos if bos is not None else 0]], {"max_new_tokens": 1, "temperature": 0.0})
        (stream,) = aengine.submit(reqs, False)
        req = stream.req
        try:
            final = await asyncio.wait_for(stream.result(), HEALTH_GENERATE_TIMEOUT_S)
        except asyncio.TimeoutError:
            aengine.abort(req.rid)
            return error_response(503, f"health_generate: no token within {HEALTH_GENERATE_TIMEOUT_S:.0f}s")
        if final.completion_tokens < 1 or final.finish_type == "abort":
            fr = final.finish_reason.to_json() if final.finish_reason else None
            return error_response(503, f"health_generate: the probe request produced no token (finish_reason {fr})")
        return JSONResponse({"status": "ok"})

    @app.post("/generate")
    async def generate(request: Request):
        body, sub = await body_of(request, state.models.generate,
                                  lambda b: req_builder.from_generate(engine, b))
        tt = TokenText(engine.tokenizer.decode) if body.return_text_in_logprobs else None
        return await generate_api.generate_response(request, aengine, sub, body.stream, tt, body.return_prompt_token_ids)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body, sub = await body_of(request, state.models.completion,
                                  _checked(state, lambda b: req_builder.from_completion(engine, b)))
        call = _call(state, "completion", sub, body.logprobs is not None, body)
        return await openai_api.openai_response(request, aengine, call, body.stream)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body, sub = await body_of(request, state.models.chat,
                                  _checked(state, lambda b: req_builder.from_chat(engine, b, state.args.chat_template)))
        call = _call(state, "chat", sub, body.logprobs, body)
        return await openai_api.openai_response(request, aengine, call, body.stream)

    @app.post("/v1/responses")
    async def responses(request: Request):
        """OpenAI's Responses API through the chat path, responses stored (``impl/server/responses_api.py``)."""
        store = state.responses

        def fits_context(b: Any, conversation: list[dict[str, Any]]) -> bool:
            try:
                chat = responses_api.chat_request(b, state.models.chat, conversation)
                n = req_builder.chat_prompt_len(engine, chat, state.args.chat_template)
            except (InvalidRequest, APIError):  # (the bounds before tokenizing: characters, messages; a template's
                return False  # refusal: the cut from the last user message on is then refused as it stands)
            return n + (b.max_output_tokens or 1) <= engine.intake_policy.max_req_len

        def build(b: Any) -> Any:
            if b.store and not store.enabled:
                raise APIError(400, "this server stores no responses (YOCO_RESPONSES_STORE_MB=0); send store false "
                                    "or leave it out", "store")
            if b.background and (b.store is False or not store.enabled):
                why = "it is not" if b.store is False else "this server stores none (YOCO_RESPONSES_STORE_MB=0)"
                raise APIError(400, "a background response is read back from the store (GET /v1/responses/{id}), "
                                    f"and {why}: send background false, or store true to a server with a store",
                               "background")
            previous = None
            if b.previous_response_id is not None:
                pid = b.previous_response_id
                if state.background.get(pid) is not None:
                    raise APIError(400, f"response {pid!r:.260} is still running in the background: continue it "
                                        f"once it has finished (GET /v1/responses/{{id}} shows its status)",
                                   "previous_response_id")
                previous = store.get(pid)
                if previous is None:
                    raise APIError(404, store.not_found(pid), "previous_response_id")
                if previous.response.get("status") == "failed":
                    raise APIError(400, f"response {pid!r:.260} failed: it has no output to continue; send its "
                                        "conversation as input", "previous_response_id")
            turn = responses_api.Turn.of(b, previous, store if store.enabled and b.store is not False else None)
            conversation = turn.conversation
            if b.truncation == "auto":
                conversation = responses_api.truncated(conversation, lambda conv: fits_context(b, conv))
            chat = responses_api.chat_request(b, state.models.chat, conversation)
            sub = req_builder.from_chat(engine, chat, state.args.chat_template)
            return _call(state, "chat", sub, chat.logprobs, chat), turn

        body, (call, turn) = await body_of(request, state.models.responses, _checked(state, build))
        return await responses_api.respond(request, aengine, call, body, state.model_name, turn, state.background)

    responses_api.add_store_routes(app, state.responses, state.background, aengine)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        """vLLM's: a text's (or a conversation's) token ids, their count and the context they must fit."""
        _, ids = await body_of(request, state.models.tokenize,
                               _checked(state, lambda b: req_builder.tokenize(engine, b, state.args.chat_template)))
        return {"count": len(ids[0]), "max_model_len": state.max_req_len, "tokens": ids[0], "token_strs": ids[1]}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        """vLLM's: token ids -> their text, special tokens kept."""
        _, text = await body_of(request, state.models.detokenize,
                                _checked(state, lambda b: engine.tokenizer.decode(b.tokens, False)))
        return {"prompt": text}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        """The tokenizer's special tokens and chat template (vLLM's route; lm-evaluation-harness's remote tokenizer
        reads it, then /tokenize and /detokenize)."""
        tok = engine.tokenizer
        return {"tokenizer_class": type(tok).__name__, "bos_token": tok.bos_token, "eos_token": tok.eos_token,
                "pad_token": tok.pad_token, "unk_token": tok.unk_token, "add_bos_token": tok.add_bos_token,
                "chat_template": state.args.chat_template or tok.chat_template, "model_max_length": state.max_req_len,
                "vocab_size": tok.vocab_size}

    def model_card() -> dict[str, Any]:
        return {"id": state.model_name, "object": "model", "created": int(state.started), "owned_by": "yoco-gemma4",
                "root": state.model_name, "max_model_len": state.max_req_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        """OpenAI's model retrieval: the served model's card under any name a request's ``model`` may use."""
        try:
            _check_model(state, model_id)
        except APIError:
            return error_response(404, f"the model '{model_id}' does not exist here; GET /v1/models lists the "
                                       f"served one, '{state.model_name}'", "model")
        return model_card()

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info():
        mc = engine.model_config
        return {
            "model_path": state.args.model_path,
            "tokenizer_path": state.args.tokenizer_path or state.args.model_path,
            "served_model_name": state.model_name,
            "is_generation": True,
            "model_type": mc.model_type,
            "architectures": list(mc.architectures),
            "vocab_size": mc.vocab_size,
            "context_length": state.max_req_len,
            "num_hidden_layers": mc.num_hidden_layers,
            "num_kv_shared_layers": mc.num_kv_shared_layers,
            "kv_sharing_fast_prefill": bool(state.args.kv_sharing_fast_prefill),
            # every ModelConfig field (clients compute FLOP bounds from it: the THRU contracts by URL)
            "model_config": json_safe(dataclasses.asdict(mc)),
        }

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info():
        info = engine.get_server_info()
        if info.get("api_key"):
            info["api_key"] = "<redacted>"
        load = engine.load()
        info.update(
            served_model_name=state.model_name,
            tokenizer_path=state.args.tokenizer_path or state.args.model_path,
            dp_size=1,
            num_running_reqs=load.num_running_reqs,
            num_waiting_reqs=load.num_waiting_reqs,
            token_usage=load.token_usage,
            responses_store={**state.responses.stats(), **state.background.stats()},
        )
        return JSONResponse(json_safe(info))

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body, _ = await body_of(request, state.models.abort)
        if not body.abort_all and not body.rid:
            raise APIError(400, "pass 'rid' (the request id to abort) or 'abort_all': true", "rid")
        aengine.abort(None if body.abort_all else body.rid)
        return {"success": True}

    @app.api_route("/flush_cache", methods=["GET", "POST"], response_class=PlainTextResponse)
    async def flush_cache(timeout: float = Query(0.0, ge=0, allow_inf_nan=False,
                                                description="Seconds to wait for the server to go idle first")):
        if not await flush_when_idle(engine.flush_cache, timeout):
            return error_response(400, f"cache not flushed: requests were still in flight after timeout={timeout:g}s; "
                                       "retry when the server is idle or pass a longer ?timeout=SECONDS")
        return PlainTextResponse("Cache flushed.\n")

    add_cluster_routes(app, engine)
    add_profile_routes(app, engine, state.limits)
    add_pause_routes(app, engine, state.limits)
    add_weights_routes(app, engine, state.limits)


def _call(state: ServerState, kind: str, sub, logprobs: bool, body: Any) -> openai_api.Call:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    prefix = "cmpl-" if kind == "completion" else "chatcmpl-"
    return openai_api.Call(kind, state.model_name, sub, logprobs, include_usage,
                           TokenText(state.engine.tokenizer.decode, as_ids=bool(body.return_tokens_as_token_ids)),
                           token_ids=bool(body.return_token_ids), id=prefix + body.request_id if body.request_id else "",
                           continuous_usage=bool(body.stream and body.stream_options
                                                 and body.stream_options.continuous_usage_stats),
                           tool_calls=sub.tool_calls, stop_texts=_stop_texts(state.engine))


def _stop_texts(engine) -> tuple[str, ...]:
    """The stop tokens' texts: a tool-call answer is decoded with special tokens, and these end it."""
    tok = engine.tokenizer
    return tuple(t for t in (tok.id_to_token(i) for i in engine.scheduler_config.eos_token_ids) if t)
