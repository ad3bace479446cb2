"""Launch configurations: the command line and config files that run a plan the model picked.

:func:`export_plan` turns a training plan (a :class:`jaxmodel.Parallelism` with the model,
global batch, sequence length, precision and the recipe knobs of :func:`jaxmodel.train_step`)
into the arguments of a training framework, and a serving deployment (the plan and the
scheduler settings of :func:`jaxmodel.offline_throughput` / :func:`jaxmodel.slo_throughput`)
into a serving engine's launch command:

=============  ===========================================================================
framework      what comes out
=============  ===========================================================================
``megatron``   ``pretrain_gpt.py`` arguments (Megatron-LM / Megatron-core)
``nemo``       ``nemo llm pretrain --factory ...`` overrides and a NeMo-Run recipe snippet
``torchtitan`` a job TOML for ``python -m torchtitan.train --job.config_file``
``vllm``       ``vllm serve MODEL ...``
``sglang``     ``python -m sglang.launch_server ...``
``trtllm``     ``trtllm-serve MODEL ...`` with an ``--extra_llm_api_options`` YAML
=============  ===========================================================================

Every emitted flag or key is an entry of :data:`FLAGS`, which names the framework, the
version and the source file (argument parser or config dataclass) it was checked against
(:data:`SOURCES`); an entry missing from the table is a programming error
(``KeyError``), so the table is the complete list of what this module may print.

A plan a framework cannot express (a schedule it lacks, a ZeRO stage it has no mode for, an
overlap fraction where the framework has only on/off) raises ``ValueError`` naming the field
and its value. A plan the model itself rejects (``jaxmodel.parallel.plan`` rules: heads,
layers, batch divisibility) raises the same error :func:`jaxmodel.train_step` would.

The mapping of each model concept to its framework setting (units: counts, sequences, tokens)
is documented at the emitting function (:func:`megatron_args`, :func:`nemo_recipe`,
:func:`torchtitan_toml`, :func:`vllm_args`, :func:`sglang_args`, :func:`trtllm_args`).
Export reads the plan only (no ``train_step`` is evaluated): check the plan with
:func:`jaxmodel.train_step` / :func:`jaxmodel.offline_throughput` first.

Modules: :mod:`~jaxmodel.export.flags` (the flag table, :class:`LaunchConfig`),
:mod:`~jaxmodel.export.plans` (a plan read as integers and names), the exporters
:mod:`~jaxmodel.export.training` and :mod:`~jaxmodel.export.serving`, and here the entry
point :func:`export_plan`.
"""

from __future__ import annotations

import dataclasses

from jaxmodel.export.flags import (FLAGS, FRAMEWORKS, SERVE_FRAMEWORKS,  # noqa: F401
                                   SOURCES, TRAIN_FRAMEWORKS, LaunchConfig, Source, _Emitter)
from jaxmodel.export.plans import (SERVE_RUNTIME, ServeExportOptions, ServePlan,  # noqa: F401
                                   TrainExportOptions, TrainPlan, pipeline_stages, serve_plan,
                                   train_plan)
from jaxmodel.export.serving import sglang_args, trtllm_args, vllm_args  # noqa: F401
from jaxmodel.export.training import (NEMO_FACTORIES, megatron_args,  # noqa: F401
                                      nemo_recipe, torchtitan_toml)
from jaxmodel.types import Model, Parallelism


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------
def _plan_of(plan) -> tuple[Parallelism, dict]:
    """A :class:`jaxmodel.Parallelism` and the row's other entries from ``plan``: a
    Parallelism, or a mapping / table row with its fields (a row of
    :func:`jaxmodel.search_parallelism`: the plan fields, and ``precision``, ``dp_overlap``,
    ``tp_overlap`` when it searched them)."""
    if isinstance(plan, Parallelism):
        return plan, {}
    if not hasattr(plan, "keys"):
        raise ValueError(f"export_plan: plan must be a jaxmodel.Parallelism or a mapping of "
                         f"its fields, got {type(plan).__name__}")
    names = [f.name for f in dataclasses.fields(Parallelism)]
    row = {str(k): plan[k] for k in plan.keys()}
    kw = {k: row[k] for k in names if k in row and row[k] is not None}
    extra = {k: row[k] for k in ("precision", "dp_overlap", "tp_overlap", "pp_overlap")
             if k in row}
    return Parallelism(**kw), extra


_TRAIN_EXPORTERS = {"megatron": megatron_args, "nemo": nemo_recipe,
                    "torchtitan": torchtitan_toml}
_SERVE_EXPORTERS = {"vllm": vllm_args, "sglang": sglang_args, "trtllm": trtllm_args}
_ALIASES = {"megatronlm": "megatron", "megatroncore": "megatron", "tensorrtllm": "trtllm",
            "trtllmserve": "trtllm", "nemo2": "nemo"}


def framework_name(framework: str) -> str:
    """The canonical name of ``framework`` (case, ``-`` and ``_`` ignored; aliases
    ``megatron-lm``, ``megatron-core``, ``tensorrt-llm``)."""
    fw = str(framework).lower().replace("-", "").replace("_", "")
    fw = _ALIASES.get(fw, fw)
    if fw not in FRAMEWORKS:
        raise ValueError(f"export_plan: framework={framework!r} is not one of "
                         f"{list(FRAMEWORKS)}")
    return fw


def _options(where: str, given, cls):
    """``given`` (None or a ``cls``) as a ``cls``; anything else is a ``ValueError``."""
    if given is None:
        return cls()
    if not isinstance(given, cls):
        raise ValueError(f"export_plan: {where} must be a jaxmodel.{cls.__name__}, got "
                         f"{type(given).__name__}")
    return given


def _set_fields(options) -> list[str]:
    """The fields of an options dataclass that are set (not None)."""
    return [f.name for f in dataclasses.fields(options)
            if getattr(options, f.name) is not None]


def export_plan(plan: Parallelism, *, framework: str = "megatron", model: Model | None = None,
                global_batch=None, seq_len=None, precision=None,
                training: TrainExportOptions | None = None,
                serving: ServeExportOptions | None = None) -> LaunchConfig:
    """The launch command (and files) that run ``plan`` on ``framework``.

    Args:
        plan: a :class:`jaxmodel.Parallelism` with scalar leaves (one configuration).
        framework: one of :data:`FRAMEWORKS`: training ``megatron``, ``torchtitan``;
            serving ``vllm``, ``sglang``, ``trtllm``.
        model: the :class:`jaxmodel.Model` (``hw_db.model(name)``).
        global_batch, seq_len: training: sequences per step, tokens per sequence (required).
        precision: a preset name (``None``: the recipe's, else ``"bf16"``).
        training: training frameworks, :class:`jaxmodel.TrainExportOptions` — the overlap
            fractions ``dp_overlap``, ``tp_overlap``, ``pp_overlap`` as
            :func:`jaxmodel.train_step` (``None``: the recipe's value, else train_step's
            default), the ``recipe`` and an optional ``system`` whose first network tier sets
            the launcher's nodes and processes per node.
        serving: serving frameworks, :class:`jaxmodel.ServeExportOptions` — ``max_batch``,
            ``max_tokens`` (sequences and tokens per iteration and replica), ``chunk``
            (chunked-prefill tokens, 0 = off), as :func:`jaxmodel.offline_throughput` /
            :func:`jaxmodel.slo_throughput`; ``kv_dtype`` (``"fp8"``, ``"bf16"``, ``"fp16"``,
            ``"auto"``; ``None``: from the precision's KV bytes); ``runtime``, the preset
            whose scheduler defaults fill the settings left ``None`` (default
            :data:`SERVE_RUNTIME` of the framework).

    Returns:
        A :class:`LaunchConfig` (``.command``, ``.files``, ``.flags``, ``.notes``).

    Raises:
        ValueError: an unknown framework, a missing or bad argument, a plan the model rejects,
            or one the framework cannot express (the message names the field and value).

    Example:
        >>> cfg = jm.export_plan(jm.Parallelism(dp=8, tp=8, pp=8, sp=True, interleave=8,
        ...                      schedule="interleaved"), model=hw_db.model("llama3.1-405b"),
        ...                      global_batch=2048, seq_len=8192, precision="fp8")
        >>> [cfg.flags[k] for k in ("--account-for-embedding-in-pipeline-split",
        ...  "--account-for-loss-in-pipeline-split", "--num-layers-per-virtual-pipeline-stage")]
        [True, True, 2]
        >>> cfg.command.startswith("torchrun pretrain_gpt.py --num-layers 126")
        True
    """
    fw = framework_name(framework)
    if model is None:
        raise ValueError("export_plan: model is required (hw_db.model(name))")
    training = _options("training", training, TrainExportOptions)
    serving = _options("serving", serving, ServeExportOptions)
    plan, row = _plan_of(plan)
    if fw in TRAIN_FRAMEWORKS:
        precision = row.get("precision") if precision is None else precision
        # a search row's overlap fractions fill the knobs left None
        training = dataclasses.replace(training, **{
            k: row[k] for k in ("dp_overlap", "tp_overlap", "pp_overlap")
            if getattr(training, k) is None and k in row})
        for name, v in (("global_batch", global_batch), ("seq_len", seq_len)):
            if v is None:
                raise ValueError(f"export_plan: {name} is required for a training export "
                                 f"({fw})")
        wrong = _set_fields(serving)
        if wrong:
            raise ValueError(f"export_plan: {wrong[0]} applies to serving frameworks "
                             f"{list(SERVE_FRAMEWORKS)}, not {fw}")
        p = train_plan(plan, model, global_batch, seq_len, precision=precision,
                       options=training)
        return _TRAIN_EXPORTERS[fw](p)
    wrong = ["global_batch"] * (global_batch is not None) + _set_fields(training)
    if wrong:
        raise ValueError(f"export_plan: {wrong[0]} applies to training frameworks "
                         f"{list(TRAIN_FRAMEWORKS)}, not {fw}")
    p = serve_plan(plan, model, framework=fw, precision=precision, options=serving)
    return _SERVE_EXPORTERS[fw](p)
