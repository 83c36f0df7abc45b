"""What GPUs a worker has: read from `nvidia-smi`, mapped to the catalog's GPU kinds.

A GPU worker announces its inventory (count, kind, memory of each, name as nvidia-smi gives it)
and consumes the queue of its kind, `labs.gpu.<kind>`, so a lab priced for an H100 runs on an
H100. A name the catalog does not know keeps its own name (kind None); such a worker gets a queue
named after its GPU and is shown, but the lab form cannot offer it (there is nothing to predict
with).

`LABS_NVIDIA_SMI` names the nvidia-smi executable (the tests point it at a stand-in).
Standard library only: no Django, no torch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

_MIB = 1024 * 1024
# nvidia-smi names to catalog kinds, first match wins. A100s carry their memory in the name on
# SXM4 ("A100-SXM4-80GB") but not always on PCIe ("A100-PCIE-40GB", "A100 80GB PCIe"); the
# memory decides when the name does not.
_KIND_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bH100\b.*\b(PCIe|PCIE)\b", "h100-pcie"),
    (r"\bH100\b.*\b(HBM3|SXM)", "h100-sxm"),
    (r"\bH200\b", "h200"),
    (r"\bB200\b", "b200"),
    (r"\bL40S\b", "l40s"),
    (r"\bL4\b", "l4"),
    (r"\bA100\b.*\b80\s?GB\b", "a100-80gb"),
    (r"\bA100\b.*\b40\s?GB\b", "a100-40gb"),
)


def kind_for(name: str, memory_bytes: int | None = None) -> str | None:
    """The catalog kind of a GPU named `name` by nvidia-smi, or None if the catalog has no such
    GPU."""
    for pattern, kind in _KIND_PATTERNS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return kind
    if re.search(r"\bA100\b", name) and memory_bytes:
        return "a100-80gb" if memory_bytes > 60 * 1024**3 else "a100-40gb"
    return None


@dataclass(frozen=True)
class GpuInventory:
    """This worker's visible GPUs. `kind` is None when the catalog does not know `name`."""

    count: int
    name: str
    kind: str | None
    memory_bytes: int | None  # of each GPU, as nvidia-smi reports it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def label(self) -> str:
        """`2× NVIDIA H100 80GB HBM3 (h100-sxm, 80 GiB each)`."""
        size = f", {self.memory_bytes / 1024**3:.0f} GiB each" if self.memory_bytes else ""
        kind = self.kind or "not in the catalog"
        return f"{self.count}\u00d7 {self.name} ({kind}{size})"


def parse_smi(text: str, visible: str | None = None) -> GpuInventory | None:
    """`nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits` output
    -> the inventory of the GPUs CUDA_VISIBLE_DEVICES (`visible`) leaves to this worker. A
    worker with mixed GPUs is described by its first one (vLLM's tensor parallelism needs
    matching GPUs anyway)."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        try:
            memory = int(float(parts[2]) * _MIB)
        except ValueError:
            memory = None
        rows.append((parts[0], parts[1], memory))
    if visible is not None and visible.strip():
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        rows = [r for r in rows if r[0] in wanted]
    if not rows:
        return None
    _, name, memory = rows[0]
    return GpuInventory(
        count=len(rows), name=name, kind=kind_for(name, memory), memory_bytes=memory
    )


def read_gpus() -> GpuInventory | None:
    """This machine's GPUs from nvidia-smi ($LABS_NVIDIA_SMI), or None without one."""
    smi = shutil.which(os.environ.get("LABS_NVIDIA_SMI") or "nvidia-smi")
    if smi is None:
        return None
    query = ["--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(
            [smi, *query], capture_output=True, text=True, timeout=20, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_smi(out, os.environ.get("CUDA_VISIBLE_DEVICES"))
