"""hf_mlcl: multi-label supervised contrastive learning on the HuggingFace stack."""

__version__ = "0.1.0"
