"""vLLM's own argument code behind a pipe: the server side of the ``vllm`` subject.

Run by ``contracts/adapters/vllm_adapter.py`` as ``<vllm venv>/bin/python vllm_bridge.py`` (a script, not a module
of ``contracts``: it imports only the standard library and vLLM, which lives in its own virtualenv, the one
``make bench-peer`` builds; from the checkout only ``contracts/logcapture.py``, standard library only). One JSON
request per line on stdin, one JSON answer per line on the file descriptor it was started with as stdout;
everything vLLM prints goes to stderr.

Requests (``op``), on command lines already in vLLM's own options (the adapter translates the contracts' SGLang
options first, ``contracts/adapters/vllm_options.py``):

* ``options``: every ``--option`` of ``vllm serve``'s engine arguments (``EngineArgs.add_cli_args`` on vLLM's
  ``FlexibleArgumentParser``), with the help text ``vllm serve --help`` prints;
* ``parse`` ``argv``: the ``EngineArgs`` fields ``EngineArgs.from_cli_args`` builds, or the parser's refusal;
* ``check`` ``argv``, ``env``: ``EngineArgs.create_engine_config()`` (vLLM's whole configuration and validation:
  ``ModelConfig``, ``CacheConfig``, ``SpeculativeConfig``, ``VllmConfig.__post_init__``) on this machine's platform
  (the CPU), with ``env`` set; answers the operator's input (the ``EngineArgs`` fields), the resolved fields (the
  ``CacheConfig`` and ``SchedulerConfig`` fields, the attention backend and the speculative method), the
  ``ModelConfig`` fields, the log records of the ``vllm`` loggers and the error the configuration raised.

vLLM logs some lines once per process (``logger.info_once`` / ``warning_once``, ``lru_cache``-backed): those caches
are cleared before each check, so every check sees the whole startup log a fresh ``vllm serve`` would print.
``HF_HUB_OFFLINE=1``: model folders are local ``config.json`` files.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import io
import logging
import os
import sys
from typing import Any

# contracts/logcapture.py is standard library only: the bridge shares it from the checkout it runs in.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from contracts.adapters.bridge_server import error_answer, parse_answer, serve, take_stdout  # noqa: E402
from contracts.logcapture import capture_logs, patched_env  # noqa: E402

ACTIONS = {"_StoreTrueAction": "store_true", "_StoreAction": "store", "_StoreFalseAction": "store_false"}


def plain(value: Any) -> Any:
    """A JSON value for ``value``: enums by name, containers element-wise, dataclasses as dicts, others as repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    return repr(value)


def _error(e: BaseException) -> dict[str, Any]:
    """vLLM's error as the adapter rebuilds it: a pydantic ValidationError raised for a ValueError in a config's
    validator is reported as that ValueError (its message), which is what ``vllm serve`` prints."""
    message = str(e)
    if type(e).__name__ == "ValidationError" and "Value error, " in message:
        message = message.split("Value error, ", 1)[1].split(" [type=", 1)[0]
        return error_answer(e, message, ["ValueError", "Exception", "BaseException"])
    return error_answer(e)


def _parser() -> Any:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm serve")
    EngineArgs.add_cli_args(parser)
    return parser


def _parse(argv: list[str]) -> tuple[Any, str | None]:
    """(EngineArgs, None), or (None, the parser's message) when vLLM's parser refuses ``argv``."""
    from vllm.engine.arg_utils import EngineArgs

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return EngineArgs.from_cli_args(_parser().parse_args(list(argv))), None
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return None, (lines[-1] if lines else "the command line was refused")


def _fields(record: Any) -> dict[str, Any]:
    return {f.name: plain(getattr(record, f.name)) for f in dataclasses.fields(record)}


def _scalars(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    names = [f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else list(vars(obj))
    out = {}
    for name in names:
        if name.startswith("_"):
            continue
        v = getattr(obj, name, None)
        if v is None or isinstance(v, (bool, int, float, str, enum.Enum)):
            out[name] = plain(v)
    return out


def op_options(req: dict[str, Any]) -> dict[str, Any]:
    import vllm.engine.arg_utils as arg_utils

    saved = arg_utils.NEEDS_HELP
    arg_utils.NEEDS_HELP = True  # the help text `vllm serve --help` prints (vLLM skips it otherwise)
    arg_utils._compute_kwargs.cache_clear()
    try:
        parser = _parser()
    finally:
        arg_utils.NEEDS_HELP = saved
        arg_utils._compute_kwargs.cache_clear()
    out = []
    for act in parser._actions:
        kind = type(act).__name__
        for opt in act.option_strings:
            if opt.startswith("--") and opt != "--help" and not (kind == "BooleanOptionalAction" and opt.startswith("--no-")):
                out.append({"option": opt, "dest": act.dest, "action": ACTIONS.get(kind, kind),
                            "default": plain(act.default), "help": act.help or ""})
    return {"options": out}


def op_parse(req: dict[str, Any]) -> dict[str, Any]:
    return parse_answer(*_parse(req["argv"]), _fields)


def _clear_once_caches() -> None:
    """vLLM's once-per-process log lines print again (their lru_caches emptied)."""
    import vllm.logger as vlogger

    for name in dir(vlogger):
        fn = getattr(vlogger, name)
        if name.startswith("_print_") and name.endswith("_once") and hasattr(fn, "cache_clear"):
            fn.cache_clear()


def op_check(req: dict[str, Any]) -> dict[str, Any]:
    with patched_env(dict(req.get("env") or {})):
        record, refused = _parse(req["argv"])
        if refused is not None:
            return {"refused": refused}
        user = _fields(record)
        _clear_once_caches()
        error, config = None, None
        with capture_logs("vllm", logging.INFO) as log:
            try:
                config = record.create_engine_config()
            except ImportError:
                raise  # a package vLLM imports is missing from its virtualenv: the bridge's defect, not a verdict
            except Exception as e:  # noqa: BLE001 - reported to the contracts, which judge it
                error = _error(e)
    resolved: dict[str, Any] = dict(user)
    model_config: dict[str, Any] = {}
    if config is not None:
        resolved.update(_scalars(config.scheduler_config))
        resolved.update(_scalars(config.cache_config))
        backend = getattr(getattr(config, "attention_config", None), "backend", None)
        resolved["attention_backend"] = plain(backend)
        spec = config.speculative_config
        resolved["speculative_method"] = spec.method if spec is not None else None
        model_config = _scalars(config.model_config)
    return {"user": user, "resolved": resolved, "resolutions": [], "log": log, "model_config": model_config,
            "error": error}


OPS = {"options": op_options, "parse": op_parse, "check": op_check}


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = take_stdout()  # vLLM's prints and warnings go to stderr, never into the answers
    import vllm.config  # noqa: F401 - import once, up front (~20 s)
    import vllm.engine.arg_utils  # noqa: F401

    return serve(out, __import__("vllm").__version__, OPS, _error)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__).parse_args()
    raise SystemExit(main())
