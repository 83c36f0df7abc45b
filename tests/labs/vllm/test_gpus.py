"""A GPU worker's inventory from nvidia-smi, and the catalog kind each GPU name maps to."""

from __future__ import annotations

import pytest

from labs.backends.vllm.gpus import GpuInventory, kind_for, parse_smi
from labs.parameters.catalog import GPUS
from labs.runs.workers import gpu_queue, queue_suffix

GIB = 1024**3


@pytest.mark.parametrize(
    ("name", "memory_gib", "kind"),
    [
        ("NVIDIA H100 80GB HBM3", 80, "h100-sxm"),
        ("NVIDIA H100 PCIe", 80, "h100-pcie"),
        ("NVIDIA H200", 141, "h200"),
        ("NVIDIA B200", 180, "b200"),
        ("NVIDIA L4", 22.5, "l4"),
        ("NVIDIA L40S", 45, "l40s"),
        ("NVIDIA A100-SXM4-80GB", 80, "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", 40, "a100-40gb"),
        ("NVIDIA A100-PCIE-40GB", 40, "a100-40gb"),
        ("NVIDIA A100 80GB PCIe", 80, "a100-80gb"),
        ("NVIDIA A100 PCIe", 80, "a100-80gb"),  # no size in the name: the memory decides
        ("NVIDIA GeForce RTX 4090", 24, None),
        ("NVIDIA H100 NVL", 94, None),  # 94 GB: not the catalog's H100
        ("NVIDIA L40", 45, None),
    ],
)
def test_nvidia_smi_names_map_to_catalog_kinds(name, memory_gib, kind):
    got = kind_for(name, int(memory_gib * GIB))
    assert got == kind
    assert got is None or got in GPUS


def test_the_inventory_is_the_visible_gpus_and_unknown_names_keep_theirs():
    table = (
        "0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA H100 80GB HBM3, 81559\n2, NVIDIA L4, 23034\n"
    )
    every = parse_smi(table)
    assert (every.count, every.kind, every.memory_bytes) == (3, "h100-sxm", 81559 * 1024**2)
    visible = parse_smi(table, "2")
    assert (visible.count, visible.kind, _queue(visible)) == (1, "l4", "labs.gpu.l4")
    odd = parse_smi("0, NVIDIA GeForce RTX 4090, 24564\n")
    assert odd.kind is None and odd.name == "NVIDIA GeForce RTX 4090"
    assert _queue(odd) == "labs.gpu.nvidia-geforce-rtx-4090"
    assert "not in the catalog" in odd.label()
    assert parse_smi("") is None and parse_smi(table, "7") is None
    assert queue_suffix("h100-sxm", "whatever") == "h100-sxm"


def _queue(inventory: GpuInventory) -> str:
    """The queue of the inventory's device kind, as labs.runs.workers names it."""
    return gpu_queue(queue_suffix(inventory.kind, inventory.name))
