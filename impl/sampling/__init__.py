from impl.sampling.sampling_params import SamplingParams

__all__ = ["SamplingParams"]
