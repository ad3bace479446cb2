"""Device-level feasibility for the operator models and the concrete validator."""

import pytest

import hw_db
import jaxmodel as jm


@pytest.mark.parametrize("name", hw_db.names("device"))
def test_every_hw_db_device_is_usable(name):
    dev = hw_db.device(name)
    jm.validate_device_for_ops(dev)
    ok, why = jm.ops_feasible(dev)
    assert bool(ok) and int(why) == 0


def test_validator_names_field_and_value():
    with pytest.raises(ValueError, match="local_buffer_bytes"):
        jm.validate_device_for_ops(hw_db.device("a100_80gb", local_buffer_bytes=512.0))
    with pytest.raises(ValueError, match="global_buffer_bytes"):
        jm.validate_device_for_ops(hw_db.device("a100_80gb", global_buffer_bytes=1000.0))
    with pytest.raises(ValueError, match="mem_bw"):
        jm.validate_device_for_ops(hw_db.device("a100_80gb").__class__(
            **{**hw_db.device("a100_80gb").__dict__, "mem_bw": 0.0}))
