"""Lab runs, sweeps and the workers that announce themselves.

The `LabRun` row is the single truth about a run: Celery only carries a turn on its queue (the
worker picks whose run goes, labs.runs.turns). State changes are conditional UPDATEs in
`labs.runs.submission` (claim, progress, finish, cancel, reap), so a duplicate message, a cancel
and a reaper can race without one overwriting the other.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils import timezone

from config.choices import TextChoices
from labs.parameters.device_calibration import DeviceConstants, check_constants


class RunState(TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    DONE = "done", "done"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


ACTIVE_STATES = (RunState.QUEUED, RunState.RUNNING)
TERMINAL_STATES = (RunState.DONE, RunState.FAILED, RunState.CANCELLED)


class LabRunQuerySet(models.QuerySet["LabRun"]):
    def for_owner(self, user: object) -> LabRunQuerySet:
        return self.filter(owner=user)

    def active(self) -> LabRunQuerySet:
        return self.filter(state__in=ACTIVE_STATES)


class Sweep(models.Model):
    """One setting varied over a list of values; each value is a `LabRun` of the sweep."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    lab = models.SlugField(max_length=40)
    backend = models.CharField(max_length=20)
    field = models.CharField(max_length=40)
    values = models.JSONField(help_text="the swept values, normalised, in order")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"sweep {self.pk}: {self.field} over {len(self.values)} values"

    def get_absolute_url(self) -> str:
        return reverse("labs:sweep-detail", args=[self.pk])


class LabRun(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    lab = models.SlugField(max_length=40)
    preset = models.SlugField(max_length=80, blank=True)
    backend = models.CharField(max_length=20)
    # Where the run was sent (labs.sim, labs.gpu or labs.gpu.<kind>): the reaper asks whether a
    # worker consumes it. Blank on runs made before it was recorded: the backend's queue.
    queue = models.CharField(max_length=60, blank=True)
    params = models.JSONField(help_text="validated parameters: LabParams.as_dict()")
    predicted = models.JSONField(default=dict, help_text="predict(params).as_dict() at submit")
    state = models.CharField(max_length=12, choices=RunState.choices, default=RunState.QUEUED)
    progress = models.FloatField(default=0.0)
    # What the backend said it is doing besides requests (labs.backends.base.Phase.as_dict):
    # starting its engine, or ready (started, reused). Empty for the simulator.
    phase = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # When the reaper sent this queued run a turn again, the broker having lost its own (a Redis
    # restarted empty): a run whose second turn is lost too is failed, not sent a third.
    turn_resent_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True, help_text="hostname that claimed it")
    where = models.CharField(max_length=200, blank=True, help_text="'simulated on CPU', ...")
    result = models.JSONField(null=True, blank=True, help_text="metrics.summarize(record)")
    error = models.TextField(blank=True)
    sweep = models.ForeignKey(
        Sweep, null=True, blank=True, on_delete=models.CASCADE, related_name="runs"
    )
    sweep_index = models.PositiveSmallIntegerField(null=True, blank=True)

    objects = LabRunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["owner", "state"]),
            models.Index(fields=["state", "heartbeat_at"]),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(progress__gte=0) & models.Q(progress__lte=1),
                name="labrun_progress_0_1",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.lab}, {self.backend}, {self.state})"

    def get_absolute_url(self) -> str:
        return reverse("labs:run-detail", args=[self.pk])

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def can_cancel(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def percent(self) -> int:
        return round(self.progress * 100)

    @property
    def worker_died(self) -> bool:
        """Failed after its heartbeat fell silent (the reaper's verdict on a killed worker)."""
        if self.state != RunState.FAILED or not (self.heartbeat_at and self.finished_at):
            return False
        silence = self.finished_at - self.heartbeat_at
        return silence >= timedelta(seconds=settings.LABS_RUN_STALE_S)

    @property
    def duration(self) -> timedelta | None:
        """The wall-clock time the run was worked on: until it stored its result or failed, or,
        when its worker died, until the worker's last heartbeat (not the silence after it)."""
        if not (self.started_at and self.finished_at):
            return None
        end = self.heartbeat_at if self.worker_died else self.finished_at
        return max(end - self.started_at, timedelta(0))


class QueueTurn(models.Model):
    """When a learner's work was last taken from a lab queue: the queue serves next the learner
    whose turn is oldest (labs.runs.turns). One row per learner and queue, written as work is
    taken."""

    queue = models.CharField(max_length=60)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    taken_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "owner"], name="one_turn_per_queue_learner")
        ]

    def __str__(self) -> str:
        return (
            f"{self.queue}: learner {self.owner_id} last served {self.taken_at:%Y-%m-%d %H:%M:%S}"
        )


class WorkerHeartbeatQuerySet(models.QuerySet["WorkerHeartbeat"]):
    def online(self, now: datetime | None = None) -> WorkerHeartbeatQuerySet:
        now = now or timezone.now()
        return self.filter(last_seen__gte=now - timedelta(seconds=settings.LABS_WORKER_ONLINE_S))


class WorkerHeartbeat(models.Model):
    """A worker process serving one lab backend; `last_seen` is bumped every few seconds."""

    hostname = models.CharField(max_length=200)
    backend = models.CharField(max_length=20)
    queue = models.CharField(max_length=60)
    where = models.CharField(max_length=200, help_text="how its results are labelled")
    gpu_name = models.CharField(max_length=200, blank=True)
    # A GPU worker's inventory (labs.backends.worker_inventory): count, name, kind (None outside
    # the catalog), memory_bytes of each, vllm version. Empty for the simulator.
    gpus = models.JSONField(default=dict, blank=True)
    versions = models.JSONField(default=dict)
    pid = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)

    objects = WorkerHeartbeatQuerySet.as_manager()

    class Meta:
        ordering = ["backend", "hostname"]
        constraints = [
            models.UniqueConstraint(fields=["hostname", "backend"], name="one_heartbeat_per_worker")
        ]

    def __str__(self) -> str:
        return f"{self.hostname} ({self.backend})"


class DeviceCalibration(models.Model):
    """Constants fitted to runs measured on one device (`manage.py lab calibrate`), with their
    errors. The newest row of a device prices that device's predictions and simulations
    (labs.runs.selectors.device_calibration); no other device's runs read it."""

    device = models.CharField(
        max_length=200,
        db_index=True,
        help_text='a catalog GPU kind ("h100-sxm") or "cpu:<model>:<cores>"',
    )
    where = models.CharField(
        max_length=200, default="this worker", help_text="who measured the runs, for the label"
    )
    constants = models.JSONField(
        help_text="labs.parameters.device_calibration.CONSTANT_BOUNDS names"
    )
    fit_error = models.FloatField(help_text="median |relative error| of the fitted points")
    held_out_error = models.FloatField(help_text="median |relative error| of held-out points")
    points = models.JSONField(
        default=list, blank=True, help_text="each point: id, role, metric, measured, predicted"
    )
    fitted_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["device", "-fitted_at", "-id"]

    def __str__(self) -> str:
        return f"{self.device}: held-out error {self.held_out_error:.0%}"

    def to_constants(self) -> DeviceConstants:
        """The row as plain data for the predictor and the simulator."""
        return DeviceConstants(
            device=self.device,
            **check_constants(self.constants),
            fitted_on=timezone.localdate(self.fitted_at),
            fit_error=self.fit_error,
            held_out_error=self.held_out_error,
            where=self.where,
        )


class CalibrationJobQuerySet(models.QuerySet["CalibrationJob"]):
    def active(self) -> CalibrationJobQuerySet:
        return self.filter(state__in=ACTIVE_STATES)


class CalibrationJob(models.Model):
    """A request to calibrate one device on its own vLLM worker, by a staff member (the devices
    page) or by the worker itself on its first start (`self_started`): queued, running, done
    with the DeviceCalibration it stored, or failed with why. The row is the truth, Celery
    carries its id; state changes are conditional UPDATEs (labs.calibration.jobs), as for
    lab runs. One device has at most one job queued or running."""

    device = models.CharField(max_length=200, db_index=True, help_text="DeviceCalibration.device")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    queue = models.CharField(max_length=60, help_text="where the task was sent")
    base = models.JSONField(help_text="the sweep's base lab settings (model, gpu, ...)")
    repeats = models.PositiveSmallIntegerField()
    rounds = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=12, choices=RunState.choices, default=RunState.QUEUED)
    note = models.CharField(max_length=300, blank=True, help_text="the sweep's latest log line")
    error = models.TextField(blank=True)
    worker = models.CharField(max_length=200, blank=True, help_text="hostname that claimed it")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    calibration = models.ForeignKey(
        DeviceCalibration, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    self_started = models.BooleanField(
        default=False, help_text="queued by the worker itself: its device had no calibration"
    )

    objects = CalibrationJobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # Two presses at once both pass the check before saving; the database keeps one.
            models.UniqueConstraint(
                fields=["device"],
                condition=models.Q(state__in=ACTIVE_STATES),
                name="one_active_calibration_per_device",
            )
        ]

    def __str__(self) -> str:
        return f"calibration {self.pk} of {self.device} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


# Lab questions' models live with their package; imported here so the app registers them.
from labs.questions.models import LabQuestion, Prediction, QuestionSimulation  # noqa: E402, F401
