"""SGLang's own argument code behind a pipe: the server side of the ``sglang`` subject.

Run by ``contracts/adapters/sglang_adapter.py`` as ``<sglang venv>/bin/python sglang_bridge.py`` (a script,
not a module of ``contracts``: it imports only the standard library, torch and SGLang, which live in their own
virtualenv, built by ``make conformance-sglang``; from the checkout only ``contracts/logcapture.py``, which is
standard library only). It reads one JSON request per line on stdin and writes one
JSON answer per line on the file descriptor it was started with as stdout; everything SGLang prints goes to
stderr.

Requests (``op``):

* ``options``: every ``--option`` of ``sglang serve``'s parser (``ServerArgs.add_cli_args``).
* ``parse`` ``argv``: ``prepare_server_args(argv)``: the record's fields, or the parser's refusal.
* ``check`` ``argv``, ``platform``, ``env``: a new record from ``prepare_server_args(argv)`` (a resolved record
  is sealed, and a failed one cannot be retried), then ``resolve_once()`` inside
  ``runtime_context.override_platform(...)`` (SGLang's own way to say what machine this is; ``platform`` is one of
  ``cpu``, ``ampere``, ``hopper``, ``sm100``, ``sm120``) with ``env`` set; answers the operator's input
  (the record's fields), the resolved fields (``resolved_dict()``), the declared resolutions, the log records of
  the ``sglang`` loggers and the error resolution raised (type, its builtin bases, message).

``HF_HUB_OFFLINE=1`` is set: model folders are local ``config.json`` files (in the multimodal ``gemma4`` layout
for Gemma-4, which 0.5.23's config parser needs; the adapter writes them). ``--device`` is added from the
platform unless given: ``cpu`` for the CPU, ``cuda`` for the GPU platforms (resolution then sees a CUDA
device through the platform facts; nothing is allocated).

torchvision: PyPI's torchvision wheels link the CUDA build of torch; this virtualenv has the CPU build (the
project's pin), so torchvision's C++ operators cannot load. ``import torchvision`` then fails on the two operator
schemas it registers fake kernels for unconditionally (``nms``, ``qnms``); SGLang imports ``torchvision.transforms``
at import time (``sglang.srt.configs``) for image preprocessing, never torchvision's operators during argument
resolution. So the schemas are declared (no kernels) before SGLang is imported; any call of those operators
would fail loudly.
"""

from __future__ import annotations

import contextlib
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

GPU = dict(is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_musa=False, is_mps=False, has_amx=False,
           has_flashinfer=True)
PLATFORMS: dict[str, dict[str, Any]] = {
    "cpu": dict(is_cuda=False, is_hip=False, is_npu=False, is_xpu=False, is_musa=False, is_mps=False, is_sm90=False,
                is_sm100=False, is_sm100_or_sm110=False, is_sm110=False, is_sm120=False, is_blackwell=False,
                is_hopper_with_cuda_12_3=False, has_flashinfer=False, has_amx=False),
    "ampere": dict(GPU, is_sm90=False, is_sm100=False, is_sm100_or_sm110=False, is_sm110=False, is_sm120=False,
                   is_blackwell=False, is_hopper_with_cuda_12_3=False, device_sm=80, device_capability=(8, 0)),
    "hopper": dict(GPU, is_sm90=True, is_sm100=False, is_sm100_or_sm110=False, is_sm110=False, is_sm120=False,
                   is_blackwell=False, is_hopper_with_cuda_12_3=True, device_sm=90, device_capability=(9, 0)),
    "sm100": dict(GPU, is_sm90=False, is_sm100=True, is_sm100_or_sm110=True, is_sm110=False, is_sm120=False,
                  is_blackwell=True, is_hopper_with_cuda_12_3=False, device_sm=100, device_capability=(10, 0)),
    "sm120": dict(GPU, is_sm90=False, is_sm100=False, is_sm100_or_sm110=False, is_sm110=False, is_sm120=True,
                  is_blackwell=True, is_hopper_with_cuda_12_3=False, device_sm=120, device_capability=(12, 0)),
}


def _declare_torchvision_schemas() -> None:
    import torch

    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor qscores, float iou_threshold) -> Tensor")
    _KEEP.append(lib)  # the schemas live as long as the library object


_KEEP: list[Any] = []


def plain(value: Any) -> Any:
    """A JSON value for ``value``: enums by value, tuples and sets as lists, records as dicts, others as repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    fields = getattr(type(value), "__struct_fields__", None) or getattr(type(value), "__dataclass_fields__", None)
    if fields:
        return {name: plain(getattr(value, name, None)) for name in fields}
    return repr(value)


def _parse(argv: list[str]) -> tuple[Any, str | None]:
    """(record, None), or (None, the parser's message) when ``sglang serve``'s parser refuses ``argv``."""
    from sglang.srt.server_args import prepare_server_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return prepare_server_args(list(argv)), None
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return None, (lines[-1] if lines else "the command line was refused")


def _fields(record: Any) -> dict[str, Any]:
    from sglang.srt.arg_groups.arg_utils import record_fields

    return {f.name: plain(getattr(record, f.name)) for f in record_fields(type(record))}


def op_options(req: dict[str, Any]) -> dict[str, Any]:
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    out = []
    for act in parser._actions:
        kind = type(act).__name__
        action = {"_StoreTrueAction": "store_true", "_StoreAction": "store", "_StoreFalseAction": "store_false"}.get(kind, kind)
        for opt in act.option_strings:
            if opt.startswith("--") and opt != "--help":
                out.append({"option": opt, "dest": act.dest, "action": action, "default": plain(act.default),
                            "help": act.help or ""})
    return {"options": out}


def op_parse(req: dict[str, Any]) -> dict[str, Any]:
    return parse_answer(*_parse(req["argv"]), _fields)


def _device_argv(argv: list[str], platform: str) -> list[str]:
    if any(a == "--device" or a.startswith("--device=") for a in argv):
        return list(argv)
    return [*argv, "--device", "cpu" if platform == "cpu" else "cuda"]


def op_check(req: dict[str, Any]) -> dict[str, Any]:
    from sglang.srt.runtime_context import override_platform

    platform = req.get("platform", "cpu")
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; one of {sorted(PLATFORMS)}")
    with patched_env(dict(req.get("env") or {})):
        record, refused = _parse(_device_argv(req["argv"], platform))
        if refused is not None:
            return {"refused": refused}
        error = None
        # what `sglang serve` logs at its default --log-level info
        with capture_logs("sglang", logging.INFO) as log, override_platform(**PLATFORMS[platform]):
            try:
                record.resolve_once()
            except ImportError:
                raise  # a package SGLang imports is missing from its virtualenv: the bridge's defect, not a verdict
            except Exception as e:  # noqa: BLE001 - reported to the contracts, which judge it
                error = error_answer(e)
        user = _fields(record)
        try:
            resolved = plain(record.resolved_dict())
        except Exception:  # noqa: BLE001 - a record whose resolution failed part-way may not project
            resolved = dict(user)
        resolutions = [[source, name, plain(value)]
                       for source, fields in getattr(record, "_resolved_overrides", ()) for name, value in fields.items()]
        model_config: dict[str, Any] = {}
        if error is None:
            try:
                from sglang.srt.arg_groups.overrides import model_config_of

                mc = model_config_of(record)
                model_config = {k: plain(v) for k, v in vars(mc).items()
                                if not k.startswith("_") and isinstance(v, (bool, int, float, str, type(None)))}
            except Exception:  # noqa: BLE001 - no model config (a dummy model): reported empty
                model_config = {}
    return {"user": user, "resolved": resolved, "resolutions": resolutions, "log": log,
            "model_config": model_config, "error": error}


OPS = {"options": op_options, "parse": op_parse, "check": op_check}


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = take_stdout()  # SGLang's prints and warnings go to stderr, never into the answers
    _declare_torchvision_schemas()
    import sglang.srt.arg_groups.kv_cache_hook  # noqa: F401 - import once, up front (~5 s)
    import sglang.srt.server_args  # noqa: F401

    return serve(out, __import__("sglang").__version__, OPS, error_answer)


if __name__ == "__main__":
    raise SystemExit(main())
