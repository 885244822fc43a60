from impl.args.check import check_server_args
from impl.args.platform import Platform
from impl.args.resolution import (
    attention_backends_of,
    declare_resolution,
    resolutions_of,
    resolved_view,
    resolving_view,
)
from impl.args.server_args import ServerArgs, make_parser

__all__ = [
    "Platform",
    "ServerArgs",
    "attention_backends_of",
    "check_server_args",
    "declare_resolution",
    "make_parser",
    "resolutions_of",
    "resolved_view",
    "resolving_view",
]
