"""A loss's own parameters (msc's prototypes) under several processes, through the integrations.

``SentenceTransformerTrainer`` and ``Trainer(compute_loss_func=...)`` wrap the model for DDP / FSDP /
DeepSpeed, not the loss: without a rule of their own, each process would step its own copy of the prototypes
with its own batch's gradient, and the copies would drift apart. Two real gloo processes, each with its own
batch: both get the same gradient, the mean of the two single-process gradients (the rule DDP applies to the
model's parameters), for the sentence-transformers loss, its GradCache variant and ``ContrastiveLossFunc``.
With a queue, both integrations enqueue the keys of every process (rank order): one batch leaves the same
queue on both processes, that of one process given both batches."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("sentence_transformers")

from _loss_parameters_worker import prototype_gradients, queue_contents  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
WORDS = "heart kidney brain tumour lung pain acute chronic scan dose".split()


def _batch(seed: int, rows: int = 6, num_labels: int = 4) -> tuple[list[str], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    texts = [
        " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (5,), generator=g)) for _ in range(rows)
    ]
    labels = (torch.rand(rows, num_labels, generator=g) < 0.4).float()
    labels[torch.arange(rows), torch.arange(rows) % num_labels] = 1.0  # every row has a label
    return texts, labels


def _run(folder, rank: int, world_size: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([ROOT, HERE])}
    return subprocess.Popen(
        [
            sys.executable,
            os.path.join(HERE, "_loss_parameters_worker.py"),
            str(rank),
            str(world_size),
            str(folder),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(180)
def test_two_processes_average_the_loss_parameters_gradient(tmp_path, bert_tokenizer, tiny_bert_config):
    from transformers import BertModel

    torch.manual_seed(0)
    BertModel(tiny_bert_config).save_pretrained(tmp_path / "bert")
    bert_tokenizer.save_pretrained(tmp_path / "bert")
    word = Transformer(str(tmp_path / "bert"), max_seq_length=16)
    SentenceTransformer(modules=[word, Pooling(word.get_embedding_dimension(), "mean")], device="cpu").save(
        str(tmp_path / "st")
    )
    torch.save([_batch(1), _batch(2)], tmp_path / "batches.pt")

    procs = [_run(tmp_path, rank, 2) for rank in (0, 1)]
    outs = [p.communicate(timeout=150) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    two = [torch.load(tmp_path / f"grads{rank}.pt") for rank in (0, 1)]

    # each batch alone, in this process (no process group): the reference of the mean
    model = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    model.eval()
    alone = [prototype_gradients(model, *batch) for batch in torch.load(tmp_path / "batches.pt")]

    names = ("sentence_transformers", "sentence_transformers_cached", "compute_loss_func")
    assert two[0].keys() == {*names, *(f"{n}_averages" for n in names)}
    for name in names:
        assert int(two[0][f"{name}_averages"]) == 1, (
            name
        )  # one all-reduce of the prototypes' gradient per backward
        assert not torch.allclose(alone[0][name], alone[1][name], rtol=1e-3), name  # the batches differ
        mean = (alone[0][name] + alone[1][name]) / 2
        torch.testing.assert_close(two[0][name], two[1][name], rtol=0, atol=0, msg=name)
        torch.testing.assert_close(two[0][name], mean, rtol=1e-5, atol=1e-8, msg=name)

    queues = [torch.load(tmp_path / f"queues{rank}.pt") for rank in (0, 1)]
    (texts0, labels0), (texts1, labels1) = torch.load(tmp_path / "batches.pt")
    both = queue_contents(model, texts0 + texts1, torch.cat([labels0, labels1]))
    for name, (keys, labels) in both.items():
        assert keys.shape[0] == 12, name
        for rank in (0, 1):
            torch.testing.assert_close(queues[rank][name][0], keys, rtol=1e-5, atol=1e-6, msg=name)
            assert torch.equal(queues[rank][name][1], labels), name
