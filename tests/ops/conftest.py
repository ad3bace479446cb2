"""Shared fixtures for the operator-model tests."""

import pytest

import jaxmodel  # noqa: F401  (import before hw_db)
import hw_db
from jaxmodel.types import Device


@pytest.fixture(scope="session")
def a100():
    return hw_db.device("a100_80gb")


@pytest.fixture(scope="session")
def toy():
    """One core, one 16×16 lane, 64 B/cycle DRAM, 4096 B/cycle global buffer, 1 GHz, no overhead."""
    return Device(freq_hz=1e9, core_count=1.0, lanes_per_core=1.0, vector_width=32.0,
                  vector_flops_per_cycle=1.0, sa_rows=16.0, sa_cols=16.0, sa_mac_per_cycle=1.0,
                  local_buffer_bytes=1e6, global_buffer_bytes=1e8,
                  global_buffer_bytes_per_cycle=4096.0, mem_bw=64e9, mem_capacity=1e10,
                  exp_flops=10.0, name="toy")
