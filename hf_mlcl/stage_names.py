"""The names of a run's stages, shared by the recipes that list them (:mod:`hf_mlcl.recipes`) and the code that
runs them (:mod:`hf_mlcl.training.stages`)."""

__all__ = ["CLASSIFIER_STAGES", "DEFAULT_STAGES", "STAGES"]

STAGES = ("contrastive", "probe", "joint")  # in the order a run takes them
DEFAULT_STAGES = ("contrastive", "probe")  # a recipe without `stages:`
CLASSIFIER_STAGES = ("probe", "joint")  # the stages that write the classifier (one per run)
