"""Runnable examples of the public API: the exported callables whose docstring has no
``>>>`` example are listed (``-s``) and may only become fewer (the examples run as doctests,
``--doctest-modules``)."""

import inspect

import jaxmodel as jm
from test_api import _lazy, public_names

#: Exported callables without a runnable example (classes included): 69 when this check was
#: written, 64 after the examples of LaunchConfig, reason_name, negative_binomial_yield,
#: dies_per_wafer and lora; lower it when adding examples.
MAX_WITHOUT_EXAMPLE = 64


def without_example() -> list[str]:
    return [n for n in public_names() if not _lazy(n) and callable(getattr(jm, n))
            and ">>>" not in (inspect.getdoc(getattr(jm, n)) or "")]


def test_exported_callables_without_example_only_decrease():
    missing = without_example()
    print(f"\n{len(missing)} exported callables without a runnable example: {missing}")
    assert len(missing) <= MAX_WITHOUT_EXAMPLE, missing
    assert "export_plan" not in missing and "train_step" not in missing
