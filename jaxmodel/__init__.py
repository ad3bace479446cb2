"""jaxmodel: a vectorised, differentiable performance and cost model of LLM training and
inference on accelerator systems.

Every latency, communication and cost formula is a pure JAX function of configuration pytrees
(:class:`Device`, :class:`System`, :class:`Model`, :class:`Parallelism`), so one jitted, vmapped
call evaluates a whole design space and ``jax.grad`` differentiates with respect to continuous
hardware knobs. See ``docs/architecture.md`` for the public API contract.

Example:
    >>> import jaxmodel as jm, hw_db
    >>> dev = hw_db.device("a100_80gb")
    >>> t = jm.gemm_latency(dev, 2048, 12288, 12288)      # seconds
"""

from jaxmodel import runtime as _runtime

_runtime.prepare_logging()   # before jaxlib loads (see runtime)

from jaxmodel.types import (ACTIVATIONS, ATTENTIONS, RECOMPUTE, SCHEDULES, TOPOLOGIES, Device,  # noqa: E402,E501
                            Model, NetLevel, Parallelism, System, validate_device, validate_model,
                            validate_parallelism, validate_system)
from jaxmodel.numerics import REASONS, reason_name  # noqa: E402
from jaxmodel.precision import (DTYPES,  # noqa: E402
                                PRESETS, Precision, precision, stack as stack_precisions,
                                validate_precision)
from jaxmodel.runtime_profile import PRESETS as RUNTIMES, Runtime, runtime as runtime_of  # noqa: E402,E501

# Each subpackage exports its public names through its own __all__ (one owner per subpackage).
from jaxmodel.ops import *  # noqa: F401,F403,E402
from jaxmodel.comm import *  # noqa: F401,F403,E402
from jaxmodel.workload import *  # noqa: F401,F403,E402
from jaxmodel.parallel import *  # noqa: F401,F403,E402
from jaxmodel.cost import *  # noqa: F401,F403,E402
from jaxmodel.serving import (OfflineResult, ServingCosts, ServingResult,  # noqa: E402
                              continuous_batching, disaggregated, offline_throughput,
                              serving_costs, slo_throughput)
from jaxmodel.speculative import Speculative, expected_tokens  # noqa: E402

from jaxmodel.recipes import RECIPES, Recipe, recipe  # noqa: E402

__version__ = "0.1.0"

# Heavy optional dependencies (pandas, optax, matplotlib, tqdm) are imported inside the
# functions that use them; the search package (pandas DataFrames) loads on first use of one of
# its names, so ``import jaxmodel`` stays well under a second.
from jaxmodel import search as _search_pkg  # noqa: E402  (lazy: its modules load on access)


def __getattr__(name):
    if name in _search_pkg.__all__:
        return getattr(_search_pkg, name)
    raise AttributeError(f"module 'jaxmodel' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_search_pkg.__all__))


_runtime.configure_compilation_cache()   # JAXMODEL_CACHE_DIR / JAXMODEL_NO_CACHE, see runtime
