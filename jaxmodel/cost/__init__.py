"""jaxmodel.cost: die area, chiplet cost, device/system cost, micro-architecture engine, TCO.

Public names:
    die_area(dev)                          LLMCompass area model, dict component -> mm²
    chiplet_cost(system_xml, netlist_xml, library_dir)   CATCH chiplet cost, USD per unit
    load_chiplet_system / chiplet_system_cost           the same, split (batched pricing)
    dies_per_wafer / negative_binomial_yield            wafer primitives
    die_cost / device_cost / system_cost                manufacturing cost, USD
    uarch(tech, budgets)                   DeepFlow micro-architecture engine -> Device
    tco(system, tokens_per_s, run_time_s)  capital + energy, USD/h, USD/Mtok, USD/run
"""

from jaxmodel.cost.area import die_area, sram_area
from jaxmodel.cost.chiplet import (ChipletCost, ChipletSystem, chiplet_cost,
                                   chiplet_system_cost, load_chiplet_system, load_library)
from jaxmodel.cost.device import (DeviceCost, SystemCost, device_cost, die_cost,
                                  dies_per_wafer_ttm, system_cost)
from jaxmodel.cost.ownership import TCO, DatacenterOperation, tco
from jaxmodel.cost.microarch import (LinkTech, SRAMTech, UArchBudgets, UArchTech, dvfs,
                                 load_deepflow_config, uarch)
from jaxmodel.cost.wafer import (dies_per_wafer, dies_per_wafer_grid, dies_per_wafer_smooth,
                                 negative_binomial_yield, reticle_utilization)

__all__: list[str] = [
    "die_area", "sram_area",
    "chiplet_cost", "chiplet_system_cost", "load_chiplet_system", "load_library",
    "ChipletSystem", "ChipletCost",
    "dies_per_wafer", "dies_per_wafer_grid", "dies_per_wafer_smooth",
    "negative_binomial_yield", "reticle_utilization",
    "die_cost", "device_cost", "system_cost", "dies_per_wafer_ttm", "DeviceCost", "SystemCost",
    "tco", "TCO", "DatacenterOperation",
    "uarch", "load_deepflow_config", "UArchTech", "UArchBudgets", "SRAMTech", "LinkTech", "dvfs",
]
