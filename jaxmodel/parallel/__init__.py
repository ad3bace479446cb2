"""jaxmodel.parallel: pipeline schedules, the training step, and inference.

Public names: :func:`train_step` → :class:`TrainResult`; :func:`inference` →
:class:`InferenceResult` (from :mod:`jaxmodel.parallel.inference_step`). Modules:
:mod:`~jaxmodel.parallel.plan` (the rules of a plan and the placement of its groups, read by
training, inference, the layer model and the search), :mod:`~jaxmodel.parallel.pipeline`
(schedule formulas), :mod:`~jaxmodel.parallel.gemm_table` (GEMM de-duplication for big
parallelism sweeps).
"""

from jaxmodel.parallel.inference_step import InferenceResult, inference
from jaxmodel.parallel.train import TrainResult, train_step

__all__ = ["train_step", "TrainResult", "inference", "InferenceResult"]
