"""jaxmodel.parallel: pipeline schedules, the training step, and inference.

Public names: :func:`train_step` → :class:`TrainResult` (the batched form of
:func:`make_train_step`'s ``step(TrainOptions)``, statics :class:`TrainStatics`); :func:`inference` →
:class:`InferenceResult` (the batched form of :func:`make_inference_step`'s
``step(InferenceOptions)``, statics :class:`InferenceStatics`; from
:mod:`jaxmodel.parallel.inference_step`). Modules:
:mod:`~jaxmodel.parallel.plan` (the rules of a plan and the placement of its groups, read by
training, inference, the layer model and the search), :mod:`~jaxmodel.parallel.pipeline`
(schedule formulas), :mod:`~jaxmodel.parallel.gemm_table` (GEMM de-duplication for big
parallelism sweeps).
"""

from jaxmodel.process import lazy_exports

# name -> module. The package loads none of its modules itself: ``plan`` and ``pipeline`` rank
# below ``workload`` (which imports them), ``train`` and ``inference_step`` above it, so the
# entry points load on first access.
_LAZY = {"train_step": "train", "TrainResult": "train", "make_train_step": "train",
         "TrainOptions": "train", "TrainStatics": "train",
         "inference": "inference_step", "InferenceResult": "inference_step",
         "make_inference_step": "inference_step", "InferenceOptions": "inference_step",
         "InferenceStatics": "inference_step"}

__all__ = ["train_step", "TrainResult", "make_train_step", "TrainOptions", "TrainStatics",
           "inference", "InferenceResult", "make_inference_step", "InferenceOptions",
           "InferenceStatics"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
