"""Lab backends: `sim` (the CPU default) and `vllm` (a real engine on a GPU worker).

Each returns a `RunRecord` (labs/backends/base.py, docs/run-record.md). Outside labs/backends/,
code reaches a backend only through this registry (and the shared types of base.py): which
backends there are, one built to run a lab, and what each says about a lab, a worker's devices
and its server. Backends are imported only when asked for, so importing this package stays cheap
and Django-free. No code outside this package compares a backend's name: it asks the question
here instead (`is_simulated`, ...).

Each backend's module (BACKENDS) answers every question below, as `BackendModule` names them;
mypy checks each module against it in labs/backends/conformance.py.

Owns: the lab backends and the registry that is the only way in (`labs.backends`, with the shared
types of `labs.backends.base`). The sim backend runs the simulator (labs.sim, which itself imports
only `labs.backends.base` of this package); every backend writes the run's definitions
(labs.explanation.definitions) into its record

May import: `labs.parameters`, `labs.prediction`, `labs.measurement`, `labs.sim`,
`labs.explanation.definitions` (and its own modules; tests/test_imports.py enforces it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, cast, runtime_checkable

from labs.backends.base import Backend, Device, Placement, ServedInstead

if TYPE_CHECKING:
    from labs.parameters.device_calibration import DeviceConstants
    from labs.parameters.params import LabParams

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendModule",
    "Device",
    "Placement",
    "backend_for_run",
    "check_can_start",
    "describe_worker",
    "device_lab_settings",
    "device_label",
    "device_state",
    "engine_busy",
    "get_backend",
    "is_simulated",
    "make_model",
    "requirement",
    "served_instead",
    "server_argv",
    "server_port",
    "StartOptions",
    "simulated_backends",
    "this_device",
    "worker_inventory",
]

# name -> the module that answers for the backend.
BACKENDS: dict[str, str] = {
    "sim": "labs.backends.sim",
    "vllm": "labs.backends.vllm",
}


@runtime_checkable
class BackendModule(Protocol):
    """Every question the registry asks of a backend's module, each answered by every backend
    (the registry's function of the same name says what it means)."""

    @property
    def BACKEND(self) -> Callable[..., Backend]:  # noqa: N802 (the module's constant)
        """The backend's class, built with its own options (get_backend)."""

    SIMULATED: bool  # its runs are simulations (labelled simulated, on CPU workers)

    def backend_for_run(
        self, *, max_run_mb: int | None, device: DeviceConstants | None
    ) -> Backend: ...

    def check_can_start(
        self,
        params: LabParams,
        devices: Sequence[Device],
        /,
        *,
        max_run_mb: int | None = None,
        elsewhere: bool = False,
    ) -> Placement | None: ...

    def requirement(self, params: LabParams) -> str: ...

    def device_lab_settings(
        self, kind: str, start: Mapping[str, Any] | None = None
    ) -> dict[str, str]: ...

    def worker_inventory(self) -> dict[str, Any] | None: ...

    def describe(self) -> dict[str, Any]: ...

    def device_label(self, announced: Mapping[str, Any]) -> str: ...

    def this_device(self, params: LabParams) -> str: ...

    def served_instead(
        self, params: LabParams, meta: Mapping[str, Any]
    ) -> ServedInstead | None: ...

    def server_argv(
        self,
        params: LabParams,
        *,
        model_path: str | None = None,
        executable: str | None = None,
        port: int | None = None,
    ) -> Sequence[str]: ...

    def device_state(self) -> dict[str, Any]: ...

    def engine_busy(self) -> str: ...

    def server_port(self) -> int | None: ...

    def make_model(self, slug: str, *, force: bool = False) -> dict[str, Any]: ...


def _module(name: str) -> BackendModule:
    """Raises ValueError: no backend has that name."""
    try:
        module_name = BACKENDS[name]
    except KeyError:
        allowed = ", ".join(BACKENDS)
        raise ValueError(f"backend must be one of {allowed}, got {name}") from None
    # NOTE: the cast is checked where it matters: mypy holds every backend's module to
    # BackendModule in labs/backends/conformance.py.
    return cast(BackendModule, importlib.import_module(module_name))


def get_backend(name: str, **options: object) -> Backend:
    """The backend called `name`, built with `options` (e.g. base_url for vllm).

    Raises:
        ValueError: no backend has that name.
    """
    return _module(name).BACKEND(**options)


def backend_for_run(
    name: str, *, max_run_mb: int | None = None, device: DeviceConstants | None = None
) -> Backend:
    """Backend `name` as a worker builds it to run a lab: `max_run_mb`, the memory one run may
    use (the simulator's), and `device`, the lab GPU's own calibration (the simulator prices
    with it); each backend takes what it uses."""
    return _module(name).backend_for_run(max_run_mb=max_run_mb, device=device)


def is_simulated(name: str) -> bool:
    """Whether backend `name`'s runs are simulations: labelled simulated, run on CPU workers
    under the simulator's queue cap."""
    return _module(name).SIMULATED


def simulated_backends() -> list[str]:
    """The backends whose runs are simulations (`is_simulated`)."""
    return [name for name in BACKENDS if is_simulated(name)]


# -- what can start where ------------------------------------------------------------------------


def check_can_start(
    name: str,
    params: LabParams,
    devices: Sequence[Device] = (),
    *,
    max_run_mb: int | None = None,
    elsewhere: bool = False,
) -> Placement | None:
    """Ask backend `name` whether the lab can start on one of `devices` and where: its one
    start-up check, called at submit (the online workers' devices) and on the worker.
    `max_run_mb`: the memory one simulated run may use (None: no limit); `elsewhere`: a worker
    of the backend that measures a server elsewhere (announcing no device) is online. Each
    backend reads what concerns it (StartOptions holds both).

    Raises:
        ParamError: what cannot start, by field.
    """
    return _module(name).check_can_start(
        params, list(devices), max_run_mb=max_run_mb, elsewhere=elsewhere
    )


class StartOptions(TypedDict):
    """What a start-up check is given besides the devices (`check_can_start`'s keywords)."""

    max_run_mb: int | None
    elsewhere: bool


def requirement(name: str, params: LabParams) -> str:
    """What the lab needs to start on backend `name`, in a sentence ("needs a vLLM worker with
    4× h100-sxm ..."), or why it cannot; "" for a backend any of its workers runs."""
    return _module(name).requirement(params)


def device_lab_settings(
    name: str, kind: str, start: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The form values that open a lab to run on backend `name` on a device of `kind` (vLLM's
    CPU build: its block size, a fixed KV pool, a workload a few cores finish); {} for none.
    `start`: the lab's own starting values, which the device may have to change (a draft
    model where the device speculates by ngram only)."""
    return dict(_module(name).device_lab_settings(kind, start or {}))


# -- a worker's devices --------------------------------------------------------------------------


def worker_inventory(name: str) -> dict[str, Any] | None:
    """The devices this worker runs backend `name` on (count, name, kind, memory_bytes each),
    read once; None for a backend without devices, or when none is found."""
    return _module(name).worker_inventory()


def describe_worker(name: str) -> dict[str, Any]:
    """How this worker's results on backend `name` are labelled, for its heartbeat: `where`,
    and for a real engine `gpu_name`, `gpus` and `versions` (it may read the devices)."""
    return dict(_module(name).describe())


def device_label(name: str, announced: Mapping[str, Any]) -> str:
    """A worker's devices as it announced them (its heartbeat's `gpus`), for the pages:
    `2× NVIDIA H100 80GB HBM3 (h100-sxm, 80 GiB each)`; "" for a backend without devices."""
    return _module(name).device_label(announced)


def this_device(name: str, params: LabParams) -> str:
    """The device the lab's settings run on with backend `name` on this machine, as its
    calibration is stored: the GPU kind, or for vLLM on a CPU this CPU's key."""
    return _module(name).this_device(params)


# -- a run's server ------------------------------------------------------------------------------


def served_instead(name: str, params: LabParams, meta: Mapping[str, Any]) -> ServedInstead | None:
    """For a finished run's record (its meta): what its numbers are expected to be for when the
    server it measured served another model than the one submitted (`.params`, or None with
    `.no_prediction` saying why); None when it served the lab's own, or the backend starts none."""
    return _module(name).served_instead(params, meta)


def server_argv(
    name: str,
    params: LabParams,
    *,
    model_path: str | None = None,
    executable: str | None = None,
    port: int | None = None,
) -> Sequence[str]:
    """The command backend `name` would start its server with for the lab (runs nothing).

    Raises:
        ValueError: the backend starts no server.
        ParamError: settings the server cannot run.
    """
    return _module(name).server_argv(
        params, model_path=model_path, executable=executable, port=port
    )


def device_state(name: str) -> dict[str, Any]:
    """What this worker's devices hold now, for its every heartbeat (a CPU worker: the memory a
    new engine could have, labs.backends.base.Device.available_bytes, and what the engine's
    processes take); {} for a backend without devices or nothing to say."""
    return dict(_module(name).device_state())


def engine_busy(name: str) -> str:
    """Why backend `name` cannot start its engine on this worker's devices now (another process
    of this installation runs one there), in a learner's words; "" when it can."""
    return _module(name).engine_busy()


def server_port(name: str) -> int | None:
    """The port backend `name` shows its server on by default; None if it starts none."""
    return _module(name).server_port()


def make_model(name: str, slug: str, *, force: bool = False) -> dict[str, Any]:
    """Build catalog model `slug` for backend `name` to load (vLLM's small real-engine models).

    Raises:
        ValueError: the backend builds no models.
        ParamError: `slug` is not a model it builds.
        RuntimeError: the build failed.
    """
    return _module(name).make_model(slug, force=force)
