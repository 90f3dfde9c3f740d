"""hf_mlcl's losses inside other HuggingFace training code.

* :mod:`hf_mlcl.integrations.sentence_transformers` — loss modules for ``SentenceTransformerTrainer``
  (needs ``pip install -e ".[sentence-transformers]"`` in the repository);
* :mod:`hf_mlcl.integrations.trainer` — a ``compute_loss_func`` for a plain ``transformers.Trainer``.

Both take ``queue_size`` for a MoCo queue in each loss paper's contrast set
(:class:`hf_mlcl.training.memory.MomentumContrast`): the sentence-transformers loss with a momentum key
encoder, the ``compute_loss_func`` with the embeddings without gradient as keys.

Import the submodule you need; this package imports neither (sentence-transformers stays optional).
"""
