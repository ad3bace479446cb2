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

from jaxmodel.types import (ACTIVATIONS, ATTENTIONS, RECOMPUTE, SCHEDULES, TOPOLOGIES, Device,
                            Model, NetLevel, Parallelism, System, validate_device, validate_model,
                            validate_parallelism, validate_system)
from jaxmodel.numerics import REASONS, reason_name
from jaxmodel.precision import (DTYPES, PRESETS, Precision, precision, stack as stack_precisions,
                                validate_precision)

# Each subpackage exports its public names through its own __all__ (one owner per subpackage).
from jaxmodel.ops import *  # noqa: F401,F403,E402
from jaxmodel.comm import *  # noqa: F401,F403,E402
from jaxmodel.workload import *  # noqa: F401,F403,E402
from jaxmodel.parallel import *  # noqa: F401,F403,E402
from jaxmodel.cost import *  # noqa: F401,F403,E402
from jaxmodel.search import *  # noqa: F401,F403,E402

__version__ = "0.1.0"
