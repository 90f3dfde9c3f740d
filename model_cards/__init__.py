"""Model-card templates (``encoder.md``, ``classifier.md``): package data of ``hf_mlcl.model_cards``, read
with :mod:`importlib.resources` by :mod:`hf_mlcl.hub.model_card`."""
