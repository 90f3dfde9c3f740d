"""A saved classifier scored again (``hf-mlcl evaluate``, a resumed run's test files) gets the scores and metrics its
training run computed: the float64 sigmoid of the float32 logits, never a float32 one that ties every logit above
about 16.6 at 1."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from datasets import Dataset

from hf_mlcl.evaluation import compute_multilabel_metrics
from hf_mlcl.evaluation.inputs import sigmoid
from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification
from hf_mlcl.training.saved_evaluation import score_classifier, stream_classifier

TEXTS = ["heart failure", "graph neural network", "kidney", "joy anger sadness", "renal cardio"]
LABELS = [[2], [0], [2, 1], [1], [2]]


@pytest.fixture
def confident(tiny_bert_config):
    """A classifier whose logits are 17, 18 and 20 plus a little of the text: float32 rounds all to 1."""
    torch.manual_seed(0)
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="cls")
    clf = MLCLForMultiLabelClassification.from_encoder(
        encoder, id2label=["a", "b", "c"], head="native"
    ).eval()
    with torch.no_grad():
        clf.classifier.weight.normal_(0, 0.01)
        clf.classifier.bias.copy_(torch.tensor([17.0, 18.0, 20.0]))
    return clf


def test_a_saved_classifier_is_scored_as_its_training_run_scored_it(confident, bert_tokenizer):
    data = Dataset.from_dict({"text": TEXTS, "labels": LABELS})
    batch = bert_tokenizer(TEXTS, padding=True, truncation=True, max_length=16, return_tensors="pt")
    with torch.no_grad():
        logits = confident(**batch).logits.float().numpy()
    assert logits.min() > 16.6  # float32's sigmoid is 1 everywhere: every ranking would tie
    truth = np.zeros((len(TEXTS), 3), dtype=bool)
    for i, row in enumerate(LABELS):
        truth[i, row] = True
    reference = sigmoid(logits.astype(np.float64))  # what ClassifierEvaluation tunes and tests on
    threshold = np.array([1 / (1 + math.exp(-17.5)), 0.5, 0.5])  # per label, between label a's and b's scores
    want = compute_multilabel_metrics(truth, reference, threshold=threshold)

    scores, got_truth = score_classifier(confident, bert_tokenizer, data, 3, max_length=16, batch_size=2)
    assert scores.dtype == np.float64 and (got_truth == truth).all()
    np.testing.assert_allclose(scores, reference, rtol=0, atol=1e-15)
    streamed = stream_classifier(confident, bert_tokenizer, data, 3, 16, batch_size=2, threshold=threshold)
    got = streamed.compute(threshold)
    tied = compute_multilabel_metrics(
        truth, 1 / (1 + np.exp(-logits)), threshold=threshold.astype(np.float32)
    )
    assert tied["map_example"] < want["map_example"] - 0.3  # float32 scoring would tie the labels
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-12, nan_ok=True), key
