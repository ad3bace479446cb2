"""Configuration pytrees: the hardware, the model and the parallelism plan.

Every numeric knob is a pytree *data* leaf (Convention 2 of docs/architecture.md), so a batch may vary
anything, including counts such as cores or the tensor-parallel degree. Discrete choices
(topology, pipeline schedule, recompute mode, activation) are stored as numeric codes; the
constructors accept their names and convert them. ``__post_init__`` only converts names to
codes: it runs under tracing too (pytree unflattening calls it), so it never looks at values.
Validation of concrete values lives in :func:`validate_device` & co. (against the ranges of
:mod:`jaxmodel.ranges`) and in the loaders; the codes of the discrete choices in
:mod:`jaxmodel.codes`.

Units are SI throughout: seconds, bytes, bytes/s, Hz, FLOP.

Example:
    >>> import jaxmodel as jm, hw_db, dataclasses, jax.numpy as jnp
    >>> dev = hw_db.device("a100_80gb")
    >>> batch = dataclasses.replace(dev, mem_bw=jnp.array([1.5e12, 2.0e12]))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# the codes of the discrete choices (jaxmodel.codes) and the ranges of the fields
# (jaxmodel.ranges) live in their own modules; their names stay importable from here
from jaxmodel.codes import (ACTIVATIONS, ALIASES, ATTENTIONS, DROPOUT_MODES,  # noqa: F401
                            FA_VERSIONS, PLACEMENTS, RECOMPUTE, SCHEDULES, TOPOLOGIES,
                            ZERO3_IMPLS, code_of)
from jaxmodel.ranges import (AREA_SENTINEL, BANDWIDTH, BUFFER, CLOCK, FLAG,  # noqa: F401
                             FRACTION, LATENCY, RANGES, SHARE, Rule, _code, _count,
                             _fmt_bound, _real, check_value, default_rule, rule_of,
                             validate_fields)

Array = Any  # a float, an int or a jax array (possibly with a leading batch axis)


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
    ``validation/anchors/llmcompass_configs``. A device has ``core_count`` cores; each core has
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
        matrix_ratio_fp32, matrix_ratio_tf32, matrix_ratio_bf16, matrix_ratio_fp16,
        matrix_ratio_fp8, matrix_ratio_fp4, matrix_ratio_int8: dense tensor-core peak of
            that compute dtype / ``peak_matrix_flops`` (0 = unsupported; jaxmodel.precisions).
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
        global_buffer_reuse_fraction: share of ``global_buffer_bytes`` that still holds the
            inputs a memory-bound kernel takes from the kernel before it (calibration
            constant; 0 = every byte from main memory; :mod:`jaxmodel.ops.vector`).
        sustained_clock_fraction: core clock under sustained (training) load over ``freq_hz``
            (power limit), 1.0 = no throttling.
        runtime_reserved_bytes: device memory a real run holds besides the model's tensors,
            bytes: memory the driver withholds from ``mem_capacity`` and the runtime context
            with its loaded library kernels (hw_db; the plan-dependent communicator buffers
            are not included; :func:`jaxmodel.workload.memory.usable_memory`).
        idle_power_w: board power with a CUDA context and no kernel running, W; −1 =
            ``jaxmodel.energy.IDLE_TDP_SHARE`` × ``tdp_w`` (:mod:`jaxmodel.energy`).
        mem_energy_per_byte: main-memory access energy, J/byte (default HBM2's 3.9 pJ/bit,
            O'Connor et al., MICRO 2017).
        link_energy_per_byte: off-device link (SerDes) energy, J/byte (default 6.5 pJ/bit,
            :mod:`jaxmodel.energy`).
        dynamic_power_w: switching power of the chip running a dense GEMM at the full clock
            ``freq_hz`` (full tensor duty), W: a property of the silicon (C·V²·f), not of the
            board limit ``tdp_w``, which only caps it; −1 = derived from ``tdp_w`` and
            ``sustained_clock_fraction`` (:func:`jaxmodel.energy.dynamic_power`).
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
    # Numeric precision (jaxmodel.precisions): dense matrix (tensor-core) peak of each compute
    # dtype relative to the modelled systolic peak ``peak_matrix_flops`` (the dense 16-bit
    # peak), from datasheets (hw_db); 0 = the dtype is not supported. Defaults are the A100's
    # (A100 whitepaper: FP32 19.5, TF32 156, BF16/FP16 312, INT8 624 dense TFLOP/s; no FP8/FP4).
    matrix_ratio_fp32: Array = 0.0625
    matrix_ratio_tf32: Array = 0.5
    matrix_ratio_bf16: Array = 1.0
    matrix_ratio_fp16: Array = 1.0
    matrix_ratio_fp8: Array = 0.0
    matrix_ratio_fp4: Array = 0.0
    matrix_ratio_int8: Array = 2.0

    def peak_matrix_flops_of(self, dtype: str) -> Array:
        """Dense matrix peak of ``dtype`` (a name of ``jaxmodel.precisions.DTYPES``), FLOP/s
        (OP/s for int8); 0 when unsupported."""
        return self.peak_matrix_flops * getattr(self, f"matrix_ratio_{dtype}")
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
    global_buffer_reuse_fraction: Array = 0.0
    sustained_clock_fraction: Array = 1.0
    runtime_reserved_bytes: Array = 0.0
    # Power model (jaxmodel.energy; values and sources in hw_db/devices/*.toml)
    idle_power_w: Array = -1.0
    mem_energy_per_byte: Array = 3.12e-11
    link_energy_per_byte: Array = 5.2e-11
    dynamic_power_w: Array = -1.0

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

def _concrete_scalars(*vals) -> bool:
    return all(not isinstance(v, jax.core.Tracer) and np.ndim(v) == 0 for v in vals)


def validate_device(dev: Device, where: str = "Device") -> Device:
    """Check a concrete device against :data:`RANGES`; raise ``ValueError`` naming the field
    and value.

    Called by the hw_db loaders and by public functions on concrete input. Values under
    tracing are not checked (inside a batch, infeasible devices give ``feasible=False``).

    Example:
        >>> validate_device(dataclasses.replace(hw_db.device("a100_80gb"), freq_hz=1410.0))
        Traceback (most recent call last):
        ...
        ValueError: Device: field 'freq_hz' = 1410.0 is too small: must be >= 1e+07 Hz
    """
    if not isinstance(dev, Device):
        raise ValueError(f"{where}: expected a jaxmodel.Device, got {type(dev).__name__}")
    validate_fields(dev, where)
    phys, cores = dev.physical_core_count, dev.core_count
    if _concrete_scalars(phys, cores) and float(phys) != 0 and float(phys) < float(cores):
        raise ValueError(f"{where}: field 'physical_core_count' = {phys!r} is below "
                         f"core_count = {cores!r} (the die has at least the enabled cores; "
                         f"0 = core_count)")
    return dev


#: Concrete checks of a device that the models above ``types`` need, each ``check(dev, where)``
#: raising ``ValueError`` that names the field and value: the operator models register theirs
#: on import (:mod:`jaxmodel.ops.feasibility`: some GEMM tile of the search grid fits the
#: buffers), so a loader that depends on ``types`` alone (``hw_db``) still rejects a device no
#: model can run (importing ``jaxmodel.types`` runs the package's ``__init__`` first, which
#: imports the operator models).
DEVICE_CHECKS: list = []


def register_device_check(check):
    """Add ``check(dev, where)`` to :data:`DEVICE_CHECKS` (once); returns ``check``."""
    if check not in DEVICE_CHECKS:
        DEVICE_CHECKS.append(check)
    return check


def validate_device_usable(dev: Device, where: str = "Device") -> Device:
    """:func:`validate_device` (field ranges) and then every registered
    :data:`DEVICE_CHECKS` (the buffers fit a GEMM tile); returns ``dev``."""
    validate_device(dev, where)
    for check in DEVICE_CHECKS:
        check(dev, where)
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
        link_latency: per-hop latency, s (on NCCL tiers ring, tree and in-network reduction
            use NCCL's per-protocol latencies instead, :mod:`jaxmodel.comm.nccl`).
        switch_latency: extra latency per switch traversal, s.
        efficiency: achievable fraction of ``bw_per_device`` (calibration constant).
        base_latency: fixed software/launch latency per collective, s (calibration constant).
        flit_bytes, header_bytes, max_payload_bytes: packet format (LLMCompass eq. 1–2).
        in_network_reduction: 1 when switches reduce in-network (NVLink SHARP), else 0.
        chunk_latency: per-chunk overhead of a pipelined collective, s (calibration constant;
            0 = Guo et al.'s unpipelined formulas). See ``jaxmodel.comm.collectives``.
        bw_per_node: uplink bandwidth shared by the devices of one lower-tier unit (a node's
            NICs), bytes/s per direction; 0 = no shared limit (one NIC per device).
        nccl_link: NCCL link class of the tier for NCCL's algorithm/protocol model
            (:mod:`jaxmodel.comm.nccl`): 0 = NVLink, 1 = PCIe, 2 = network; −1 (default) =
            not an NCCL tier (Guo et al.'s topology-specific algorithms, Simple protocol).
        ll_max_bw: NCCL's cap on the LL protocol's bus bandwidth (``llMaxBws``), bytes/s;
            0 = no cap.
        nvls_efficiency: NCCL's NVLS bandwidth factor (``nvlsEfficiency``: Hopper 0.85).
        nccl_channels: NCCL's ring/tree channels on the tier (``comm->nChannels``); small
            messages run on fewer (:func:`jaxmodel.comm.nccl.channel_factor`); 0 = always all.
        launch_floor: smallest duration of one collective kernel, s, when a host-bound loop
            issues them (rank 0 waits in its kernel for the peers' later launches); 0 = none
            (device-bound streams). Calibration constant of a measurement set-up.
        ll128_efficiency: executed bandwidth of NCCL's LL128 protocol as a fraction of the
            Simple protocol's (calibration constant; the default 0.92 is NCCL's tuner factor,
            ``tuning.cc``, which NCCL's own choice keeps using).
        channel_copy_bw: bytes/s that one NCCL channel (one thread block on one SM) moves
            through its loads and stores; the Simple protocol's ring is bound by it where its
            primitives' memory traffic exceeds the link time
            (:func:`jaxmodel.comm.nccl.copy_bytes`); 0 (default) = no bound. Calibration
            constant, fitted on all-reduce only (the reduce-scatter / all-gather / broadcast
            bounds are not validated).
        nccl_bw: NCCL's own modelled bus bandwidth of the tier (``ncclTopoTuneModel``:
            ring graph ``nChannels × bwIntra``), bytes/s, which its tuner uses to choose an
            algorithm and protocol; 0 (default) = the executed ``efficiency ×
            bw_per_device``. Also stands for the tree and NVLS graphs' bandwidth in the
            tuner (NCCL uses ``graphs[NCCL_ALGO_TREE]`` / ``graphs[NCCL_ALGO_NVLS]``; an
            approximation) and applies on switch tiers only.
        nvls_bw: executed algorithm bandwidth of NCCL's NVLS all-reduce on an NVLink tier,
            bytes/s per GPU: each GPU sends and receives the whole buffer once through the
            switch (:func:`jaxmodel.comm.nccl.nvls_allreduce_time`); NCCL's tuner still
            chooses by its own NVLS model. Calibration constant; 0 (default) = NVLS all-reduce at the
            ring's bus bandwidth (:func:`jaxmodel.comm.nccl.nvls_allreduce_factor`).
        nvls_chunk_latency: per-chunk overhead ``c`` of the NVLS all-reduce's pipeline
            (:func:`jaxmodel.comm.collectives._pipelined`), s, where ``nvls_bw > 0``: the
            multimem kernels' synchronisation per chunk through the switch. Calibration
            constant.
        nccl_nvls_latency: the NVLS latency NCCL's tuner assumes on an NVLink tier
            (``hwLat[NVLINK][NVLS][SIMPLE]``, ``src/graph/tuning.cc``) in the NCCL version
            the system runs, s; −1 (default) = NCCL 2.30.7's 25 µs
            (:data:`jaxmodel.comm.nccl.NVLS_TUNER_LATENCY`: 0 in NCCL 2.17–2.18, 23 µs in
            2.19–2.20). Only the tuner's choice reads it; the executed NVLS latency stays
            NCCL 2.30.7's table value.
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
    nccl_link: Array = -1.0
    ll_max_bw: Array = 0.0
    nvls_efficiency: Array = 1.0
    nccl_channels: Array = 0.0
    launch_floor: Array = 0.0
    ll128_efficiency: Array = 0.92
    channel_copy_bw: Array = 0.0
    nccl_bw: Array = 0.0
    nvls_bw: Array = 0.0
    nvls_chunk_latency: Array = 0.0
    nccl_nvls_latency: Array = -1.0

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
    if not isinstance(system, System):
        raise ValueError(f"{where}: expected a jaxmodel.System, got {type(system).__name__}")
    validate_device(system.device, f"{where}.device")
    for i, lvl in enumerate(system.levels):
        if not isinstance(lvl, NetLevel):
            raise ValueError(f"{where}: levels[{i}] must be a jaxmodel.NetLevel, got "
                             f"{type(lvl).__name__}")
        validate_fields(lvl, f"{where}.levels[{i}]")
    return system


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Model:
    """A decoder-only transformer: GPT, Llama, Mistral/Mixtral, Qwen, Gemma, Phi, DeepSeek,
    GPT-OSS, Falcon, GPT-J, Nemotron families.

    Read from a HF ``config.json`` by ``hw_db.model``. Counts are leaves so batches may vary
    them; every field added after the first seven has a default that switches its feature off.

    Attributes:
        n_layers: decoder layers (without multi-token-prediction modules).
        d_model: hidden size.
        n_heads: attention (query) heads.
        n_kv_heads: key/value heads (GQA/MQA; = n_heads for multi-head attention; MLA: n_heads).
        head_dim: per-head dimension (usually d_model / n_heads; MLA: unused, see below).
        d_ff: FFN intermediate size of a dense layer (and of each expert when ``moe_d_ff = 0``).
        vocab_size: vocabulary size.
        activation: code into ``ACTIVATIONS``: gelu, relu, relu2 (squared ReLU, So et al.
            2021 "Primer"; Nemotron) — 2-matrix FFNs; swiglu, geglu (gated, Shazeer 2020
            "GLU Variants Improve Transformer") — 3-matrix FFNs.
        n_experts: routed experts per MoE layer (1 = dense).
        top_k: routed experts per token.
        moe_every: every ``moe_every``-th layer (after the dense first ones) is an MoE layer
            (HF ``decoder_sparse_step`` / ``moe_layer_freq``; interleaved MoE).
        capacity_factor: GShard expert capacity factor.
        tied_embeddings: 1 when the LM head shares the embedding matrix.
        attention: code into ``ATTENTIONS``: gqa (MHA/GQA/MQA through ``n_kv_heads``) or mla
            (multi-head latent attention, DeepSeek-AI 2024, "DeepSeek-V2", §2.1).
        q_lora_rank: MLA query compression rank ``d_c'`` (0 = full-rank query projection).
        kv_lora_rank: MLA key/value latent rank ``d_c``.
        qk_nope_head_dim, qk_rope_head_dim: MLA per-head query/key dimensions without and
            with RoPE (``d_h`` and ``d_h^R``; the RoPE key is shared by all heads).
        v_head_dim: MLA per-head value dimension.
        sliding_window: attention window of local layers, tokens (0 = full attention).
        global_every: with a window, every ``global_every``-th layer attends globally
            (Gemma-2: 2, Gemma-3: 6, GPT-OSS: 2); 0 = every layer is local (Mistral-7B).
        qkv_bias: 1 when the Q, K, V projections carry biases (Qwen2, GPT-OSS).
        parallel_block: 1 when attention and MLP read the same input and their outputs are
            summed (GPT-J, Falcon; Wang & Komatsuzaki 2021; one TP reduction per layer).
        n_shared_experts: always-active experts beside the routed ones (DeepSeekMoE, Dai et
            al. 2024 §3.2), each ``moe_d_ff`` wide.
        moe_d_ff: intermediate size of one routed or shared expert (HF
            ``moe_intermediate_size``; fine-grained experts); 0 = ``d_ff``.
        first_k_dense: the first layers keep a dense FFN (HF ``first_k_dense_replace``).
        n_mtp_layers: multi-token-prediction modules (DeepSeek-V3 §2.2, HF
            ``num_nextn_predict_layers``): each a projection ``[2d, d]``, two norms and one
            decoder layer (an MoE layer when the model is MoE), sharing embedding and head.
        n_group, topk_group: node-limited routing (DeepSeek-V3 §2.1.2, HF ``n_group`` /
            ``topk_group``): the routed experts form ``n_group`` groups (one per node of the
            EP group) and a token's top-k experts lie in at most ``topk_group`` of them; 0 =
            unrestricted routing.
        attention_chunk: the local layers attend within fixed chunks of this many tokens
            (Llama-4 iRoPE, HF ``attention_chunk_size``: a token attends to the tokens of its
            own chunk) rather than a sliding window; 0 = sliding window or none. The model
            times a chunk by its upper bound, ``sliding_window`` (the same value); the flag
            decides which decode kernel a serving runtime runs on those layers
            (:class:`jaxmodel.serving_runtime.Runtime` ``chunked_attention``).
        encoder_params: parameters of a modality encoder shipped with the checkpoint
            beside the language model (Llama-4: vision tower and projector), count; no
            step runs it here (text requests), a serving runtime that loads it holds it
            in memory (:class:`jaxmodel.serving_runtime.Runtime` ``encoder_bytes``);
            0 = none.
        name: hw_db name (static metadata).
        quantization: how the published weights are stored when the checkpoint ships
            quantised (HF ``quantization_config``), e.g. ``"fp8 e4m3, 128x128 block scales"``
            (static metadata; "" = unquantised).
        serving_precision: the :data:`jaxmodel.precisions.PRESETS` name matching that storage
            ("" when none matches exactly; static metadata). The model functions take the
            precision as an argument; this records the checkpoint's native one.
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
    attention: Array = 0.0
    q_lora_rank: Array = 0.0
    kv_lora_rank: Array = 0.0
    qk_nope_head_dim: Array = 0.0
    qk_rope_head_dim: Array = 0.0
    v_head_dim: Array = 0.0
    sliding_window: Array = 0.0
    global_every: Array = 0.0
    qkv_bias: Array = 0.0
    parallel_block: Array = 0.0
    n_shared_experts: Array = 0.0
    moe_d_ff: Array = 0.0
    first_k_dense: Array = 0.0
    n_mtp_layers: Array = 0.0
    n_group: Array = 0.0
    topk_group: Array = 0.0
    attention_chunk: Array = 0.0
    encoder_params: Array = 0.0
    name: str = "custom"
    quantization: str = ""
    serving_precision: str = ""

    def __post_init__(self):
        object.__setattr__(self, "activation",
                           code_of(self.activation, ACTIVATIONS, "activation"))
        object.__setattr__(self, "attention",
                           code_of(self.attention, ATTENTIONS, "attention"))

    @property
    def is_gated(self) -> Array:
        """1 for gated FFNs (SwiGLU, GeGLU), else 0."""
        a = self.activation
        return jnp.where((a > 0.5) & (a < 2.5), 1.0, 0.0)

    @property
    def ffn_matrices(self) -> Array:
        """Weight matrices per FFN: 2 for GELU / ReLU / squared ReLU, 3 for SwiGLU / GeGLU."""
        return 2.0 + self.is_gated

    @property
    def is_mla(self) -> Array:
        return self.attention > 0.5

    @property
    def expert_d_ff(self) -> Array:
        """Intermediate size of one routed/shared expert: ``moe_d_ff``, or ``d_ff`` when 0."""
        return jnp.where(self.moe_d_ff > 0, self.moe_d_ff, self.d_ff)

    @property
    def is_moe(self) -> Array:
        return self.n_experts > 1


_register(Model, meta=("name", "quantization", "serving_precision"))


def validate_model(model: Model, where: str = "Model") -> Model:
    """Check a concrete model against :data:`RANGES` and its cross-field rules (KV heads
    dividing the query heads, ``top_k <= n_experts``); raise ``ValueError`` naming the field.
    """
    if not isinstance(model, Model):
        raise ValueError(f"{where}: expected a jaxmodel.Model, got {type(model).__name__}")
    validate_fields(model, where)
    h, kv, e, k = model.n_heads, model.n_kv_heads, model.n_experts, model.top_k
    if _concrete_scalars(h, kv) and float(h) % float(kv):
        raise ValueError(f"{where}: field 'n_kv_heads' = {kv!r} must divide n_heads = {h!r}")
    if _concrete_scalars(e, k) and float(k) > float(e):
        raise ValueError(f"{where}: field 'top_k' = {k!r} exceeds n_experts = {e!r}")
    if _concrete_scalars(model.attention) and float(model.attention) > 0.5:
        for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            v = getattr(model, f)
            if _concrete_scalars(v) and float(v) <= 0:
                raise ValueError(f"{where}: field '{f}' = {v!r} must be > 0 for MLA attention")
    fk, nl = model.first_k_dense, model.n_layers
    if _concrete_scalars(fk, nl) and float(fk) > float(nl):
        raise ValueError(f"{where}: field 'first_k_dense' = {fk!r} exceeds n_layers = {nl!r}")
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
        schedule: code into ``SCHEDULES`` (gpipe, 1f1b, interleaved, dualpipe).
        recompute: code into ``RECOMPUTE`` (none, selective, full, norm_upproj: DeepSeek-V3's
            RMSNorm + MLA up-projection recomputation, MLA models only).
        zero: ZeRO stage 0–3.
        flash_attention: attention kernel, a code into ``FA_VERSIONS``: 0 standard,
            1 FlashAttention-1, 2 FlashAttention-2 (names ``"fa1"``/``"fa2"`` and bools
            accepted; ``True`` is FlashAttention-1).
        cp: context-parallel degree (the sequence of every layer split over ``cp`` devices,
            ring attention; :mod:`jaxmodel.parallel.context`).
        zero3_impl: how ZeRO stage 3 executes, a code into ``ZERO3_IMPLS``: 0 ``"fsdp"``
            (prefetched flat-parameter units, PyTorch FSDP), 1 ``"deepspeed"`` (DeepSpeed
            stage 3 of 2021: serial per-tensor collectives); no effect unless ``zero = 3``.
        order: rank order, a code into ``PLACEMENTS``: 0 ``"tp_cp_pp_dp"`` (PTD-P: a
            pipeline's stages on neighbouring devices, data parallelism outermost), 1
            ``"tp_cp_ep_dp_pp"`` (Megatron-core's default: data and expert parallelism
            inside, pipeline stages outermost); :func:`jaxmodel.parallel.plan.placement`.
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
    cp: Array = 1.0
    zero3_impl: Array = 0.0
    order: Array = 0.0

    def __post_init__(self):
        object.__setattr__(self, "schedule", code_of(self.schedule, SCHEDULES, "schedule"))
        object.__setattr__(self, "recompute", code_of(self.recompute, RECOMPUTE, "recompute"))
        object.__setattr__(self, "zero3_impl",
                           code_of(self.zero3_impl, ZERO3_IMPLS, "zero3_impl"))
        object.__setattr__(self, "order", code_of(self.order, PLACEMENTS, "order"))
        if isinstance(self.flash_attention, str):
            object.__setattr__(self, "flash_attention",
                               code_of(self.flash_attention, FA_VERSIONS, "flash_attention"))
        for name in ("sp", "flash_attention"):
            v = getattr(self, name)
            if isinstance(v, bool):
                object.__setattr__(self, name, float(v))

    @property
    def n_devices(self) -> Array:
        """Devices used: dp · tp · pp · cp (experts are placed inside dp · tp,
        DeepSpeed-TED)."""
        return self.dp * self.tp * self.pp * self.cp


_register(Parallelism)


def validate_parallelism(par: Parallelism, where: str = "Parallelism") -> Parallelism:
    """Check a concrete plan's own ranges; raise ``ValueError`` naming the field and value.

    Example:
        >>> validate_parallelism(jm.Parallelism(sp=0.5))
        Traceback (most recent call last):
        ...
        ValueError: Parallelism: field 'sp' = 0.5 must be an integer
    """
    if not isinstance(par, Parallelism):
        raise ValueError(f"{where}: expected a jaxmodel.Parallelism, got {type(par).__name__}")
    return validate_fields(par, where)


def validate_knobs(where: str, **knobs) -> None:
    """Check concrete scalar keyword knobs of a public function (``dp_overlap``,
    ``tp_overlap`` in [0, 1], ``grad_bytes`` > 0, ``seq_len``/``batch`` integers >= 1, ...)
    against ``RANGES["knobs"]``. ``None``, arrays with a batch axis and traced values pass
    unchecked (a batch reports infeasible entries through ``feasible``)."""
    table = RANGES["knobs"]
    for name, v in knobs.items():
        if v is None or isinstance(v, jax.core.Tracer):
            continue
        if not isinstance(v, (str, bool)) and np.ndim(v) != 0:
            continue
        check_value(where, name, v, table.get(name) or default_rule(name))


VALIDATORS = {}  # filled below: config class -> validator


def validate_config(obj: Any, where: str | None = None) -> Any:
    """Validate one concrete config object (Device, NetLevel, System, Model, Parallelism)
    with its class's validator; other objects pass through."""
    fn = VALIDATORS.get(type(obj))
    if fn is None:
        return obj
    if not is_concrete(obj):
        return obj
    return fn(obj, where or type(obj).__name__)


def validate_args(*args, where: str = "", **kwargs) -> None:
    """Validate every config object among the arguments of a public call when it is
    concrete with scalar leaves (the API edge: one configuration); batches and traced
    configurations pass through unchecked."""
    prefix = f"{where}: " if where else ""
    for i, a in enumerate(list(args) + list(kwargs.values())):
        if type(a) in VALIDATORS and is_concrete(a) and all(
                np.ndim(x) == 0 for x in jax.tree_util.tree_leaves(a)):
            VALIDATORS[type(a)](a, f"{prefix}{type(a).__name__}".rstrip())


VALIDATORS.update({Device: validate_device, System: validate_system, Model: validate_model,
                   Parallelism: validate_parallelism,
                   NetLevel: lambda lvl, where="NetLevel": validate_fields(lvl, where)})


def from_preset(cls, value: Any, overrides: dict, presets: Mapping, aliases: Mapping,
                default: str, what: str):
    """A ``cls`` config from a preset name (case, ``-`` and ``_`` ignored; ``aliases`` map
    other spellings), a mapping of fields or a ``cls`` instance (``overrides`` replace
    fields; ``None`` is ``default``). ``ValueError`` names an unknown preset or field."""
    if isinstance(value, cls):
        return dataclasses.replace(value, **overrides) if overrides else value
    if value is None:
        value = default
    if isinstance(value, str):
        key = value.lower().replace("-", "").replace("_", "")
        key = aliases.get(key, key)
        if key not in presets:
            raise ValueError(f"{what}={value!r} is not one of {sorted(presets)}")
        fields = dict(presets[key], name=key)
    elif isinstance(value, Mapping):
        fields = dict(value)
    else:
        raise ValueError(f"{what} must be a name of {sorted(presets)}, a mapping or a "
                         f"jm.{cls.__name__}, got {type(value).__name__}")
    fields.update(overrides)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
    return cls(**fields)


def stack_configs(cls, configs: Sequence, what: str):
    """A batch of ``cls`` configs (every numeric field gets a leading axis, one entry per
    config) from concrete ``configs``; the static ``name`` is kept when all agree, else
    ``"batch"``. ``ValueError`` for an empty list."""
    if not configs:
        raise ValueError(f"{what}: empty list")
    fields = {f.name: np.asarray([float(np.asarray(getattr(c, f.name))) for c in configs])
              for f in dataclasses.fields(cls) if f.name != "name"}
    names = {c.name for c in configs}
    return cls(**fields, name=names.pop() if len(names) == 1 else "batch")


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
