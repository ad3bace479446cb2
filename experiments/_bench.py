"""The start every benchmark script shares: import jaxmodel first and report how long it took
and whether the persistent compilation cache is on (both shape the timings that follow).

Used as ``from _bench import import_jaxmodel`` (the script's folder is on ``sys.path``).
"""

from __future__ import annotations

import time


def import_jaxmodel():
    """Import jaxmodel (the first import in the process), print the import time and the
    compilation-cache state, and return ``(jaxmodel, import seconds, cache state)``."""
    t0 = time.perf_counter()
    import jaxmodel
    seconds = time.perf_counter() - t0
    cache = jaxmodel.process.cache_state()
    print(f"import jaxmodel {seconds:.2f} s; persistent compilation cache: {cache}",
          flush=True)
    return jaxmodel, seconds, cache
