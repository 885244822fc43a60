"""Reference Gemma-4 serving engine with YOCO (KV-sharing) fast prefill."""

__version__ = "0.1.0"

# Decide compiled vs interpreted Triton before anything (torch included) imports triton.
import impl.kernels.triton_env  # noqa: E402,F401


def __getattr__(name: str):
    if name == "Engine":
        from impl.engine.engine import Engine

        return Engine
    raise AttributeError(name)
