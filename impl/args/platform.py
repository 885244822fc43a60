"""Platform facts the argument rules depend on, detected from torch or injected by tests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Platform:
    device: str  # "cpu" | "cuda"
    compute_capability: tuple[int, int] | None = None
    name: str = "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def is_hopper(self) -> bool:
        return self.is_cuda and self.compute_capability is not None and self.compute_capability[0] == 9

    @property
    def is_sm100(self) -> bool:
        return self.is_cuda and self.compute_capability is not None and self.compute_capability[0] == 10

    @property
    def is_sm120(self) -> bool:
        return self.is_cuda and self.compute_capability is not None and self.compute_capability[0] == 12

    @property
    def is_blackwell(self) -> bool:
        return self.is_cuda and self.compute_capability is not None and self.compute_capability[0] >= 10

    # ---- constructors --------------------------------------------------
    @classmethod
    def cpu(cls) -> "Platform":
        return cls("cpu", None, "cpu")

    @classmethod
    def hopper(cls) -> "Platform":
        return cls("cuda", (9, 0), "NVIDIA H100")

    @classmethod
    def sm100(cls) -> "Platform":
        return cls("cuda", (10, 0), "NVIDIA B200")

    @classmethod
    def sm120(cls) -> "Platform":
        return cls("cuda", (12, 0), "NVIDIA RTX PRO 6000")

    @classmethod
    def ampere(cls) -> "Platform":
        return cls("cuda", (8, 0), "NVIDIA A100")

    @classmethod
    def detect(cls, device: str = "auto") -> "Platform":
        import torch

        if device in ("auto", "cuda") and torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return cls("cuda", (major, minor), torch.cuda.get_device_name())
        if device == "cuda":
            raise ValueError("--device cuda was given but torch sees no CUDA device; use --device cpu or --device auto.")
        return cls.cpu()

    @classmethod
    def by_name(cls, name: str) -> "Platform":
        table = {"cpu": cls.cpu, "hopper": cls.hopper, "sm100": cls.sm100, "sm120": cls.sm120, "ampere": cls.ampere}
        return table[name]()
