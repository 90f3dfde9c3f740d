"""Folder of the ``evaluate`` metric module; load it with ``evaluate.load(hf_mlcl.evaluation.METRIC_PATH)``.

The ``__init__.py`` makes the folder a package so the metric script ships in wheels.
"""
