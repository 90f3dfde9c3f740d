"""Multi-label classification metrics for `evaluate`: micro/macro P/R/F1, AUC, P@k, R@k, mAP, ...

Load offline from the installed package (no Hub access needed):

    import evaluate
    from hf_mlcl.evaluation import METRIC_PATH
    metric = evaluate.load(METRIC_PATH)          # optional: threshold=..., ks=..., from_logits=...
    metric.compute(predictions=probabilities, references=multi_hot)

All numbers come from `hf_mlcl.evaluation.metrics.compute_multilabel_metrics`; see its docstring for
the definitions and the 0/0 conventions.
"""

import datasets
import evaluate
import numpy as np

from hf_mlcl.evaluation.inputs import predictions_to_scores
from hf_mlcl.evaluation.metrics import DEFAULT_KS, compute_multilabel_metrics

_CITATION = """\
@inproceedings{mullenbach2018caml, title={Explainable Prediction of Medical Codes from Clinical Text},
  author={Mullenbach, James and others}, booktitle={NAACL}, year={2018}}
@inproceedings{edin2023automated, title={Automated Medical Coding on MIMIC-III and MIMIC-IV:
  A Critical Review and Replicability Study}, author={Edin, Joakim and others}, booktitle={SIGIR}, year={2023}}
"""

_DESCRIPTION = """\
Multi-label classification metrics: micro/macro precision, recall and F1 (macro_f1 = mean of
per-label F1; macro_f1_harmonic = harmonic mean of macro-P and macro-R as in CAML / PLM-ICD),
micro/macro ROC AUC, P@k and R@k, mAP per label and per example, Hamming loss, example-based F1,
subset accuracy and R-precision.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of lists of float, (N, L) scores (probabilities, or logits with from_logits=True).
    references: list of lists of int, (N, L) multi-hot ground truth.
    threshold: float or list of L floats, a label is predicted when score >= threshold (default 0.5).
    ks: cut-offs for p@k / r@k (default (1, 5, 8, 15)).
    from_logits: apply a sigmoid to predictions first (default False).
    zero_division: value used for every 0/0 (default 0.0).
Returns:
    dict with micro_precision, micro_recall, micro_f1, macro_precision, macro_recall, macro_f1,
    macro_f1_harmonic, micro_auc, macro_auc, p@k and r@k for each k, map_label, map_example,
    hamming_loss, example_f1, subset_accuracy, r_precision.
Examples:
    >>> metric = evaluate.load(METRIC_PATH)
    >>> metric.compute(predictions=[[0.9, 0.2], [0.1, 0.8]], references=[[1, 0], [0, 1]])["micro_f1"]
    1.0
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MultilabelMetric(evaluate.Metric):
    """`evaluate` wrapper of `compute_multilabel_metrics`; defaults can be set at load time."""

    def __init__(self, threshold=0.5, ks=DEFAULT_KS, from_logits=False, zero_division=0.0, **kwargs):
        self.default_threshold = threshold
        self.default_ks = tuple(ks)
        self.default_from_logits = bool(from_logits)
        self.default_zero_division = float(zero_division)
        super().__init__(**kwargs)

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("float32")),
                    "references": datasets.Sequence(datasets.Value("int32")),
                }
            ),
            reference_urls=[
                "https://github.com/jamesmullenbach/caml-mimic",
                "https://github.com/JoakimEdin/medical-coding-reproducibility",
            ],
        )

    def _compute(
        self, predictions, references, threshold=None, ks=None, from_logits=None, zero_division=None, **unused
    ):
        # `unused` swallows keyword arguments meant for other modules of an `evaluate.combine`.
        scores = np.asarray(predictions, dtype=np.float32)
        if from_logits if from_logits is not None else self.default_from_logits:
            scores = predictions_to_scores(scores, from_logits=True)
        return compute_multilabel_metrics(
            np.asarray(references),
            scores,
            threshold=self.default_threshold if threshold is None else threshold,
            ks=self.default_ks if ks is None else ks,
            zero_division=self.default_zero_division if zero_division is None else zero_division,
        )
