from impl.config.model_config import ModelConfig, RopeSpec

__all__ = ["ModelConfig", "RopeSpec"]
