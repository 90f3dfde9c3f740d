"""hf_mlcl's losses inside other HuggingFace training code.

* :mod:`hf_mlcl.integrations.sentence_transformers` — loss modules for ``SentenceTransformerTrainer``
  (needs ``pip install -e ".[sentence-transformers]"`` in the repository);
* :mod:`hf_mlcl.integrations.trainer` — a ``compute_loss_func`` for a plain ``transformers.Trainer``.

Import the submodule you need; this package imports neither (sentence-transformers stays optional).
"""
