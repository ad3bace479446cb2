"""Configuration pytrees: the hardware, the model and the parallelism plan.

Every numeric knob is a pytree *data* leaf (Convention 2 of docs/architecture.md), so a batch may vary
anything, including counts such as cores or the tensor-parallel degree. Discrete choices
(topology, pipeline schedule, recompute mode, activation) are stored as numeric codes; the
constructors accept their names and convert them. ``__post_init__`` only converts names to
codes: it runs under tracing too (pytree unflattening calls it), so it never looks at values.
Validation of concrete values lives in :func:`validate_device` & co. and in the loaders.

Units are SI throughout: seconds, bytes, bytes/s, Hz, FLOP.

Example:
    >>> import jaxmodel as jm, hw_db, dataclasses, jax.numpy as jnp
    >>> dev = hw_db.device("a100_80gb")
    >>> batch = dataclasses.replace(dev, mem_bw=jnp.array([1.5e12, 2.0e12]))
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = Any  # a float, an int or a jax array (possibly with a leading batch axis)

# Discrete choices, encoded by their position (docs/architecture.md, "Codes").
TOPOLOGIES = ("ring", "switch", "fully_connected", "mesh2d", "torus2d")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
ACTIVATIONS = ("gelu", "swiglu")


def code_of(value: Any, names: Sequence[str], field: str) -> Any:
    """Map a name to its numeric code; pass numbers and arrays through untouched.

    Args:
        value: a name from ``names``, or a number / array already holding codes.
        names: the ordered names; the code of ``names[i]`` is ``i``.
        field: field name used in the error message.

    Raises:
        ValueError: ``value`` is a string that is not one of ``names``.
    """
    if isinstance(value, str):
        key = value.lower().replace("-", "_")
        aliases = {"fc": "fully_connected", "full_connected": "fully_connected",
                   "mesh": "mesh2d", "torus": "torus2d", "2d_mesh": "mesh2d",
                   "2d_torus": "torus2d", "interleaved_1f1b": "interleaved",
                   "pipedream_flush": "1f1b", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu",
                   "silu": "swiglu", "swish": "swiglu", "relu": "gelu"}
        key = aliases.get(key, key) if key not in names else key
        if key not in names:
            raise ValueError(f"{field}={value!r} is not one of {list(names)}")
        return float(names.index(key))
    return value


def _register(cls, meta: Sequence[str] = ()):
    fields = [f.name for f in dataclasses.fields(cls)]
    return jax.tree_util.register_dataclass(
        cls, data_fields=[f for f in fields if f not in meta], meta_fields=list(meta))


# --------------------------------------------------------------------------------------------
# Device
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Device:
    """One accelerator after LLMCompass's hardware template (system → device → core → lane).

    Source: LLMCompass §III-A, Fig. 2 and the JSON templates in
    ``shared/anchors/llmcompass_configs``. A device has ``core_count`` cores; each core has
    ``lanes_per_core`` lanes, each lane one vector unit (``vector_width`` elements ×
    ``vector_flops_per_cycle`` FLOP per element per cycle) and one systolic array of
    ``sa_rows × sa_cols`` PEs doing ``sa_mac_per_cycle`` MACs per cycle each. Cores share a
    global buffer (L2) in front of main memory (HBM/DDR).

    Attributes (SI units):
        freq_hz: core clock, Hz.
        core_count: cores (SMs / CUs / TensorCores).
        lanes_per_core: lanes (sub-cores) per core; one vector unit + one systolic array each.
        vector_width: vector-unit width, elements.
        vector_flops_per_cycle: FLOP per vector element per cycle.
        exp_flops: FLOP the vector unit spends on one ``exp``.
        sa_rows, sa_cols: systolic-array height and width, PEs.
        sa_mac_per_cycle: MACs per PE per cycle (fractional for slower arrays).
        local_buffer_bytes: local buffer (L1 / shared memory / SRAM) per core, bytes.
        global_buffer_bytes: global buffer (L2), bytes.
        global_buffer_bytes_per_cycle: global-buffer bandwidth, bytes per cycle (whole chip).
        mem_bw: main-memory bandwidth, bytes/s (peak, datasheet).
        mem_capacity: main-memory capacity, bytes.
        mem_bw_efficiency: achievable fraction of ``mem_bw`` (calibration constant, hw_db).
        matmul_overhead_s, softmax_overhead_s, layernorm_overhead_s, gelu_overhead_s:
            fixed per-kernel launch/runtime overhead, s (calibration constants, hw_db).
        vector_dtype_bytes: element size the vector unit computes in (2 = fp16, 4 = fp32).
        process_node_nm: logic process node, nm (area/cost model).
        physical_core_count: cores on the die incl. disabled ones (area model); 0 = core_count.
        mem_channels: memory channels/stacks (HBM stacks or DDR channels).
        device_links: off-device links (NVLink, ICI, Infinity Fabric) per device.
        tdp_w: board power, W (total cost of ownership).
        name: hw_db name (static metadata).
        physical_global_buffer_bytes, physical_local_buffer_bytes, physical_mem_channels,
        physical_device_links: on-die counts incl. disabled ones (area model).
        regfile_bytes_per_lane, regfile_ports: register file per lane (area model).
        lane_int32_units, lane_fp16_units, lane_fp32_units, lane_fp64_units: vector ALUs per
            lane (area model).
        sa_mantissa_bits: systolic-array data-type mantissa (10 = fp16, 7 = bf16; area model).
        mem_protocol: 0 HBM2e, 1 DDR5, 2 PCIe5, 3 PCIe4 (area and memory cost).
        link_protocol: 0 NVLink3, 1 NVLink4, 2 InfinityFabric, 3 PCIe5, 4 PCIe4 (area model).
        All area-only fields default to -1 = "look up hw_db/tech/device_area.toml by name".
        matmul_efficiency: fraction of the peak tensor rate a library GEMM kernel's main loop
            sustains (calibration constant; :func:`jaxmodel.ops.gemm._library_seconds`).
        matmul_wave_latency_s: pipeline fill + epilogue of one wave of GEMM tiles, s.
        matmul_bw_efficiency: fraction of ``mem_bw`` a GEMM kernel's operand stream reaches
            (weight-streaming bound); 0 = ``mem_bw_efficiency``.
        matmul_kernel_overhead_s: device-side floor of one GEMM kernel (kernel timer), s.
        rmsnorm_overhead_s, rope_overhead_s, silu_mul_overhead_s, add_overhead_s,
        embedding_overhead_s: device-side floor of one fused kernel of that family, s.
        rmsnorm_bw_efficiency, rope_bw_efficiency, silu_mul_bw_efficiency, add_bw_efficiency,
        embedding_bw_efficiency: fraction of ``mem_bw`` that kernel family reaches
            (calibration constants); 0 = ``mem_bw_efficiency``.
        mem_latency_s: one dependent global-memory round trip of a thread, s (the latency
            chain of per-row kernels; calibration constant, 0 = none).
        sustained_clock_fraction: core clock under sustained (training) load over ``freq_hz``
            (power limit), 1.0 = no throttling.
    """

    freq_hz: Array
    core_count: Array
    lanes_per_core: Array
    vector_width: Array
    vector_flops_per_cycle: Array
    sa_rows: Array
    sa_cols: Array
    sa_mac_per_cycle: Array
    local_buffer_bytes: Array
    global_buffer_bytes: Array
    global_buffer_bytes_per_cycle: Array
    mem_bw: Array
    mem_capacity: Array
    exp_flops: Array = 35.0
    mem_bw_efficiency: Array = 1.0
    matmul_overhead_s: Array = 0.0
    softmax_overhead_s: Array = 0.0
    layernorm_overhead_s: Array = 0.0
    gelu_overhead_s: Array = 0.0
    vector_dtype_bytes: Array = 2.0
    process_node_nm: Array = 7.0
    physical_core_count: Array = 0.0
    mem_channels: Array = 5.0
    device_links: Array = 12.0
    tdp_w: Array = 400.0
    name: str = "custom"
    # Area model only (jaxmodel.cost.area). -1 = unspecified: the value listed for this device
    # name in hw_db/tech/device_area.toml, else its [generic] (GA100) value; physical_* fall
    # back to the active count.
    physical_global_buffer_bytes: Array = -1.0
    physical_local_buffer_bytes: Array = -1.0
    physical_mem_channels: Array = -1.0
    physical_device_links: Array = -1.0
    regfile_bytes_per_lane: Array = -1.0
    regfile_ports: Array = -1.0
    lane_int32_units: Array = -1.0
    lane_fp16_units: Array = -1.0
    lane_fp32_units: Array = -1.0
    lane_fp64_units: Array = -1.0
    sa_mantissa_bits: Array = -1.0
    mem_protocol: Array = -1.0
    link_protocol: Array = -1.0
    # Kernel-level calibration (jaxmodel.ops; fitted by experiments/calibrate.py, provenance in
    # hw_db/devices/*.toml). The *_overhead_s fields above are per-call times of PyTorch-eager
    # kernels (host dispatch included, LLMCompass's measurements); the fields below are
    # device-side kernel floors (kernel timers, fused kernels) and library-GEMM constants.
    matmul_efficiency: Array = 1.0
    matmul_wave_latency_s: Array = 0.0
    matmul_bw_efficiency: Array = 0.0
    matmul_kernel_overhead_s: Array = 0.0
    rmsnorm_overhead_s: Array = 0.0
    rope_overhead_s: Array = 0.0
    silu_mul_overhead_s: Array = 0.0
    add_overhead_s: Array = 0.0
    embedding_overhead_s: Array = 0.0
    rmsnorm_bw_efficiency: Array = 0.0
    rope_bw_efficiency: Array = 0.0
    silu_mul_bw_efficiency: Array = 0.0
    add_bw_efficiency: Array = 0.0
    embedding_bw_efficiency: Array = 0.0
    mem_latency_s: Array = 0.0
    sustained_clock_fraction: Array = 1.0

    @property
    def peak_matrix_flops(self) -> Array:
        """Peak systolic-array throughput, FLOP/s (2 FLOP per MAC). LLMCompass §III-A."""
        return (2.0 * self.core_count * self.lanes_per_core * self.sa_rows * self.sa_cols
                * self.sa_mac_per_cycle * self.freq_hz)

    @property
    def peak_vector_flops(self) -> Array:
        """Peak vector-unit throughput, FLOP/s. LLMCompass §III-A."""
        return (self.core_count * self.lanes_per_core * self.vector_width
                * self.vector_flops_per_cycle * self.freq_hz)

    @property
    def global_buffer_bw(self) -> Array:
        """Global-buffer bandwidth, bytes/s."""
        return self.global_buffer_bytes_per_cycle * self.freq_hz

    @property
    def achievable_mem_bw(self) -> Array:
        """Main-memory bandwidth actually reached, bytes/s (``mem_bw · mem_bw_efficiency``)."""
        return self.mem_bw * self.mem_bw_efficiency


_register(Device, meta=("name",))

DEVICE_POSITIVE = ("freq_hz", "core_count", "lanes_per_core", "vector_width",
                   "vector_flops_per_cycle", "sa_rows", "sa_cols", "sa_mac_per_cycle",
                   "local_buffer_bytes", "global_buffer_bytes", "global_buffer_bytes_per_cycle",
                   "mem_bw", "mem_capacity", "exp_flops", "mem_bw_efficiency",
                   "vector_dtype_bytes", "matmul_efficiency", "sustained_clock_fraction")
DEVICE_NONNEGATIVE = ("matmul_overhead_s", "softmax_overhead_s", "layernorm_overhead_s",
                      "gelu_overhead_s", "matmul_wave_latency_s", "matmul_kernel_overhead_s",
                      "rmsnorm_overhead_s", "rope_overhead_s", "silu_mul_overhead_s",
                      "add_overhead_s", "embedding_overhead_s", "matmul_bw_efficiency",
                      "rmsnorm_bw_efficiency",
                      "rope_bw_efficiency", "silu_mul_bw_efficiency", "add_bw_efficiency",
                      "embedding_bw_efficiency", "mem_latency_s", "physical_core_count", "mem_channels", "device_links",
                      "tdp_w", "process_node_nm")


def _check_fields(obj: Any, positive: Sequence[str], nonnegative: Sequence[str], where: str):
    for name in positive:
        v = getattr(obj, name)
        if not _all_concrete(v, lambda x: math.isfinite(x) and x > 0):
            raise ValueError(f"{where}: field '{name}' must be a finite number > 0, got {v!r}")
    for name in nonnegative:
        v = getattr(obj, name)
        if not _all_concrete(v, lambda x: math.isfinite(x) and x >= 0):
            raise ValueError(f"{where}: field '{name}' must be a finite number >= 0, got {v!r}")


def _all_concrete(value: Any, pred) -> bool:
    """True when every element of a concrete value passes ``pred``; tracers pass untested."""
    if isinstance(value, jax.core.Tracer):
        return True
    try:
        import numpy as np
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        return False
    return bool(all(pred(float(x)) for x in arr.ravel()))


def validate_device(dev: Device, where: str = "Device") -> Device:
    """Check a concrete device; raise ``ValueError`` naming the field and value.

    Called by the hw_db loaders and by public functions on concrete input. Values under
    tracing are not checked (inside a batch, infeasible devices give ``feasible=False``).
    """
    _check_fields(dev, DEVICE_POSITIVE, DEVICE_NONNEGATIVE, where)
    return dev


# --------------------------------------------------------------------------------------------
# Network and system
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class NetLevel:
    """One tier of the interconnect (e.g. NVLink inside a node, InfiniBand across nodes).

    Source: Guo et al. §III-D (topologies, "the total off-GPU bandwidth is divided by the number
    of links"); LLMCompass §III-B2 eq. 1–2 (link latency, flit/header/payload overhead).

    Attributes (SI units):
        size: devices (or lower-level groups) joined at this level.
        topology: code into ``TOPOLOGIES`` (a name is accepted and converted).
        bw_per_device: off-device bandwidth of one device at this level, bytes/s per direction,
            shared by all of that device's links at this level.
        link_latency: per-hop latency, s.
        switch_latency: extra latency per switch traversal, s.
        efficiency: achievable fraction of ``bw_per_device`` (calibration constant).
        base_latency: fixed software/launch latency per collective, s (calibration constant).
        flit_bytes, header_bytes, max_payload_bytes: packet format (LLMCompass eq. 1–2).
        in_network_reduction: 1 when switches reduce in-network (NVLink SHARP), else 0.
        chunk_latency: per-chunk overhead of a pipelined collective, s (calibration constant;
            0 = the seed's unpipelined formulas). See ``jaxmodel.comm.collectives``.
        bw_per_node: uplink bandwidth shared by the devices of one lower-tier unit (a node's
            NICs), bytes/s per direction; 0 = no shared limit (one NIC per device).
    """

    size: Array
    topology: Array
    bw_per_device: Array
    link_latency: Array
    switch_latency: Array = 0.0
    efficiency: Array = 1.0
    base_latency: Array = 0.0
    flit_bytes: Array = 16.0
    header_bytes: Array = 0.0
    max_payload_bytes: Array = 256.0
    in_network_reduction: Array = 0.0
    chunk_latency: Array = 0.0
    bw_per_node: Array = 0.0

    def __post_init__(self):
        object.__setattr__(self, "topology", code_of(self.topology, TOPOLOGIES, "topology"))


_register(NetLevel)


@dataclasses.dataclass(frozen=True)
class System:
    """A device type and its interconnect, one ``NetLevel`` per tier (innermost first).

    The number of levels is pytree structure (it changes shapes); everything else is a leaf.
    ``nodes`` scaling is done by the loaders (``hw_db.system(name, nodes=...)``) by setting the
    outer level's size.
    """

    device: Device
    levels: tuple = ()
    name: str = "custom"

    def __post_init__(self):
        if isinstance(self.levels, list):
            object.__setattr__(self, "levels", tuple(self.levels))

    @property
    def n_devices(self) -> Array:
        """Total devices: the product of the level sizes."""
        n = 1.0
        for lvl in self.levels:
            n = n * lvl.size
        return n


_register(System, meta=("name",))


def validate_system(system: System, where: str = "System") -> System:
    """Check a concrete system (device and levels); raise ``ValueError`` naming the field."""
    validate_device(system.device, f"{where}.device")
    for i, lvl in enumerate(system.levels):
        _check_fields(lvl, ("size", "bw_per_device", "efficiency", "flit_bytes",
                            "max_payload_bytes"),
                      ("link_latency", "switch_latency", "base_latency", "header_bytes",
                       "in_network_reduction", "topology", "chunk_latency", "bw_per_node"),
                      f"{where}.levels[{i}]")
    return system


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Model:
    """A decoder-only transformer (GPT / Llama / Mixtral family).

    Read from a HF ``config.json`` by ``hw_db.model``. Counts are leaves so batches may vary them.

    Attributes:
        n_layers: decoder layers.
        d_model: hidden size.
        n_heads: attention (query) heads.
        n_kv_heads: key/value heads (GQA/MQA; = n_heads for multi-head attention).
        head_dim: per-head dimension (usually d_model / n_heads).
        d_ff: FFN intermediate size (per expert for MoE).
        vocab_size: vocabulary size.
        activation: code into ``ACTIVATIONS``: gelu (2-matrix FFN) or swiglu (3-matrix FFN).
        n_experts: experts per MoE layer (1 = dense).
        top_k: experts per token.
        moe_every: every ``moe_every``-th layer is an MoE layer (HF ``decoder_sparse_step``).
        capacity_factor: GShard expert capacity factor.
        tied_embeddings: 1 when the LM head shares the embedding matrix.
        name: hw_db name (static metadata).
    """

    n_layers: Array
    d_model: Array
    n_heads: Array
    n_kv_heads: Array
    head_dim: Array
    d_ff: Array
    vocab_size: Array
    activation: Array = 0.0
    n_experts: Array = 1.0
    top_k: Array = 1.0
    moe_every: Array = 1.0
    capacity_factor: Array = 1.0
    tied_embeddings: Array = 0.0
    name: str = "custom"

    def __post_init__(self):
        object.__setattr__(self, "activation",
                           code_of(self.activation, ACTIVATIONS, "activation"))

    @property
    def ffn_matrices(self) -> Array:
        """Weight matrices per FFN: 2 for GELU, 3 for SwiGLU."""
        return 2.0 + self.activation

    @property
    def is_moe(self) -> Array:
        return self.n_experts > 1


_register(Model, meta=("name",))


def validate_model(model: Model, where: str = "Model") -> Model:
    """Check a concrete model; raise ``ValueError`` naming the field and value."""
    _check_fields(model, ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff",
                          "vocab_size", "n_experts", "top_k", "moe_every", "capacity_factor"),
                  ("activation", "tied_embeddings"), where)
    return model


# --------------------------------------------------------------------------------------------
# Parallelism
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Parallelism:
    """A 5D parallelism plan and its execution options.

    Source: Guo et al. §III (DP, TP, PP, SP, EP; schedules; recompute; ZeRO; FlashAttention).

    Attributes:
        dp, tp, pp, ep: degrees (data, tensor, pipeline, expert).
        sp: 1 for Megatron sequence parallelism, else 0 (bools accepted).
        micro_batch: sequences per micro-batch.
        interleave: virtual pipeline stages per device (interleaved 1F1B).
        schedule: code into ``SCHEDULES`` (gpipe, 1f1b, interleaved).
        recompute: code into ``RECOMPUTE`` (none, selective, full).
        zero: ZeRO stage 0–3.
        flash_attention: 1 to use FlashAttention kernels, else 0 (bools accepted).
    """

    dp: Array = 1.0
    tp: Array = 1.0
    pp: Array = 1.0
    sp: Array = 0.0
    ep: Array = 1.0
    micro_batch: Array = 1.0
    interleave: Array = 1.0
    schedule: Array = 1.0
    recompute: Array = 0.0
    zero: Array = 0.0
    flash_attention: Array = 0.0

    def __post_init__(self):
        object.__setattr__(self, "schedule", code_of(self.schedule, SCHEDULES, "schedule"))
        object.__setattr__(self, "recompute", code_of(self.recompute, RECOMPUTE, "recompute"))
        for name in ("sp", "flash_attention"):
            v = getattr(self, name)
            if isinstance(v, bool):
                object.__setattr__(self, name, float(v))

    @property
    def n_devices(self) -> Array:
        """Devices used: dp · tp · pp (experts are placed inside dp · tp, DeepSpeed-TED)."""
        return self.dp * self.tp * self.pp


_register(Parallelism)


def validate_parallelism(par: Parallelism, where: str = "Parallelism") -> Parallelism:
    """Check a concrete plan's own ranges; raise ``ValueError`` naming the field and value."""
    _check_fields(par, ("dp", "tp", "pp", "ep", "micro_batch", "interleave"),
                  ("sp", "schedule", "recompute", "zero", "flash_attention"), where)
    if not _all_concrete(par.zero, lambda z: z in (0, 1, 2, 3)):
        raise ValueError(f"{where}: field 'zero' must be 0, 1, 2 or 3, got {par.zero!r}")
    return par


def is_concrete(*trees: Any) -> bool:
    """True when no leaf of ``trees`` is a tracer (i.e. values can be checked in Python)."""
    return not any(isinstance(x, jax.core.Tracer) for t in trees
                   for x in jax.tree_util.tree_leaves(t))


def static_flag(x, pred) -> bool | None:
    """``pred`` over a concrete array as a Python flag: True (all), False (none) or None
    (mixed, or ``x`` traced). Used to fix static graph switches at the API edge."""
    if not is_concrete(x):
        return None
    v = pred(np.asarray(x, dtype=float))
    return True if v.all() else (False if not v.any() else None)


def as_float(tree: Any, dtype=None) -> Any:
    """Cast every leaf of a config pytree to a floating jax array (default float dtype)."""
    dtype = dtype or jnp.result_type(float)
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=dtype), tree)
