"""Lab pages through the Django test client: owner, other learner, anonymous, and htmx."""

from __future__ import annotations

import contextlib
import re
from datetime import timedelta
from unittest import mock

import pytest
from django.urls import reverse
from django.utils import timezone

from labs.models import LabRun, RunState, Sweep
from labs.parameters.presets import LABS, load_presets
from labs.runs import execution, queueing, reaping, submission
from labs.sim.breakdown import PART_LABELS
from tests.conftest import make_user
from tests.labs.factories import SMALL, make_heartbeat, make_run

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def no_broker():
    """Record sends instead of talking to a broker (the worker tests use the real one)."""
    with mock.patch.object(queueing, "_enqueue") as enqueue:
        yield enqueue


@pytest.fixture
def done_run(alice):
    """A run executed in-process on the real simulator: a real summary to render."""
    run = make_run(alice, lab="paged-kv", state=RunState.QUEUED)
    run.predicted = execution._predicted(submission.parse_lab_params(run.params))
    run.save()
    assert execution.run_execute(run_id=run.pk, hostname="sim@test") == RunState.DONE
    run.refresh_from_db()
    return run


@pytest.mark.parametrize(
    "url",
    [
        reverse("labs:index"),
        reverse("labs:lab-detail", args=["paged-kv"]),
        reverse("labs:run-list"),
        reverse("labs:run-detail", args=[1]),
    ],
)
def test_anonymous_visitors_are_sent_to_log_in(client, url):
    response = client.get(url)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_index_lists_every_lab_and_the_backends_online(alice, alice_client):
    make_heartbeat("sim")
    response = alice_client.get(reverse("labs:index"))
    assert response.status_code == 200
    html = response.content.decode()
    for lab in LABS.values():
        assert reverse("labs:lab-detail", args=[lab.slug]) in html
    assert "online · 1 worker · simulated on CPU" in html
    # vllm is offline; how to start it is for staff only, not for a learner.
    assert "-Q labs.gpu" not in html
    alice.is_staff = True
    alice.save()
    assert "-Q labs.gpu" in alice_client.get(reverse("labs:index")).content.decode()


@pytest.mark.parametrize("slug", list(LABS))
def test_every_lab_page_shows_its_settings_and_a_prediction(alice_client, slug):
    response = alice_client.get(reverse("labs:lab-detail", args=[slug]))
    assert response.status_code == 200
    lab = LABS[slug]
    html = response.content.decode()
    for name in lab.fields:
        assert f'name="{name}"' in html
    for key in lab.predicted:
        assert f'data-key="{key}"' in html
    assert 'hx-trigger="input changed delay:300ms, change"' in html


def test_an_unknown_lab_or_preset_is_404(alice_client):
    assert alice_client.get(reverse("labs:lab-detail", args=["nope"])).status_code == 404
    assert alice_client.get(reverse("labs:preset-open", args=["nope"])).status_code == 404


def test_a_preset_opens_its_lab_with_the_cards_numbers(alice_client):
    preset = load_presets()["contiguous-vs-paged-8k-reservation"]
    response = alice_client.get(reverse("labs:preset-open", args=[preset.slug]), follow=True)
    assert response.status_code == 200
    assert response.redirect_chain[0][0].startswith(reverse("labs:lab-detail", args=["paged-kv"]))
    html = response.content.decode()
    assert preset.title in html
    form = response.context["form"]
    assert form["max_tokens"].value() == "8192"
    assert form["kv_allocation"].value() == "contiguous"
    assert f'name="preset" value="{preset.slug}"' in html


@pytest.mark.parametrize("slug", sorted(load_presets()))
def test_every_preset_opens_its_lab_with_its_own_numbers(alice_client, slug):
    preset = load_presets()[slug]
    response = alice_client.get(reverse("labs:preset-open", args=[slug]), follow=True)
    assert response.status_code == 200
    form = response.context["form"]
    for name, value in preset.params.items():
        shown = form[name].value()
        assert str(shown).lower() == str(value).lower(), (name, shown, value)
    # The preset's numbers are valid lab parameters, so the page shows their prediction.
    assert response.context["prediction"], "no prediction for this preset"


def test_the_prediction_partial_follows_block_size(alice_client):
    url = reverse("labs:lab-predict", args=["paged-kv"])
    base = {"prompt_tokens": "700", "output_tokens": "300", "max_tokens": "2048"}
    small = alice_client.get(url, {**base, "block_size": "16"}, **HTMX)
    large = alice_client.get(url, {**base, "block_size": "256"}, **HTMX)
    assert small.status_code == large.status_code == 200
    assert "<html" not in small.content.decode()  # just the partial
    assert _predicted(small)["blocks_per_seq"] == "63 blocks"
    assert _predicted(small)["slots_wasted_per_seq"] == "8 slots"
    assert _predicted(large)["blocks_per_seq"] == "4 blocks"
    assert _predicted(large)["slots_wasted_per_seq"] == "24 slots"


def _predicted(response) -> dict[str, str]:
    pairs = re.findall(
        r'data-key="(\w+)"><dt>[^<]*</dt><dd>([^<]*)</dd>', response.content.decode()
    )
    return dict(pairs)


def test_a_bad_setting_in_the_prediction_partial_names_the_field(alice_client):
    url = reverse("labs:lab-predict", args=["paged-kv"])
    response = alice_client.get(url, {"block_size": "12"}, **HTMX)
    assert response.status_code == 400
    assert (
        "block_size must be a power of two between 1 and 256, got 12" in response.content.decode()
    )


def test_run_creates_a_queued_run_and_redirects_to_it(alice_client, alice, no_broker):
    make_heartbeat("sim")
    data = {**{k: str(v) for k, v in SMALL.items()}, "backend": "sim", "block_size": "32"}
    response = alice_client.post(reverse("labs:run-create", args=["paged-kv"]), data)
    run = LabRun.objects.get()
    assert response.status_code == 302 and response["Location"] == run.get_absolute_url()
    assert run.owner == alice and run.lab == "paged-kv" and run.state == RunState.QUEUED
    assert run.params["block_size"] == 32
    # Neither batch setting given: every prompt in flight, and the prediction is for that batch.
    assert run.params["concurrency"] == 8 and run.params["max_concurrency"] is None
    alice_client.post(reverse("labs:run-create", args=["paged-kv"]), {**data, "concurrency": "4"})
    second = LabRun.objects.latest("pk")
    assert second.params["concurrency"] == 4 and second.params["max_concurrency"] == 4


def test_run_with_no_worker_online_is_refused_with_the_reason(alice_client, no_broker):
    response = alice_client.post(reverse("labs:run-create", args=["paged-kv"]), {"backend": "sim"})
    assert response.status_code == 503
    assert "No worker for the sim backend is online" in response.content.decode()
    assert not LabRun.objects.exists()
    no_broker.assert_not_called()


def test_run_over_the_quota_is_refused(alice_client, alice, no_broker, settings):
    settings.LABS_MAX_ACTIVE_PER_LEARNER = 1
    make_heartbeat("sim")
    make_run(alice, state=RunState.RUNNING)
    response = alice_client.post(reverse("labs:run-create", args=["sandbox"]), {"backend": "sim"})
    assert response.status_code == 429
    assert "the limit is 1" in response.content.decode()
    assert LabRun.objects.count() == 1


def test_a_bad_run_gets_400_with_field_messages_and_nothing_saved(alice_client, no_broker):
    make_heartbeat("sim")
    response = alice_client.post(
        reverse("labs:run-create", args=["paged-kv"]),
        {"block_size": "-4", "num_prompts": "lots", "backend": "sim"},
    )
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "block_size must be" in errors["block_size"][0]
    assert "num_prompts must be a whole number" in errors["num_prompts"][0]
    assert not LabRun.objects.exists()
    no_broker.assert_not_called()


def test_a_pool_too_small_for_one_request_is_refused_at_submit(alice_client, no_broker):
    make_heartbeat("sim")
    response = alice_client.post(
        reverse("labs:run-create", args=["paged-kv"]),
        {"kv_capacity_tokens": "64", "prompt_tokens": "700", "backend": "sim"},
    )
    assert response.status_code == 400
    assert "kv_capacity_tokens must hold the longest request" in response.content.decode()
    assert not LabRun.objects.exists()


def test_a_finished_run_shows_measured_next_to_predicted(alice_client, done_run):
    response = alice_client.get(done_run.get_absolute_url())
    assert response.status_code == 200
    html = response.content.decode()
    assert "simulated on CPU" in html
    rows = {r.label: r for r in response.context["rows"]}
    ttft = rows["TTFT, mean"]
    assert ttft.measured.endswith("ms") and ttft.predicted.endswith("ms") and ttft.diff
    assert 'id="run-charts"' in html and 'data-chart="kv"' in html
    assert "hx-trigger" not in html  # nothing left to poll


def test_polling_a_running_run_returns_the_partial_and_stops_when_it_ends(alice_client, alice):
    run = make_run(alice, state=RunState.RUNNING, progress=0.4, heartbeat_at=timezone.now())
    response = alice_client.get(run.get_absolute_url(), **HTMX)
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert 'hx-trigger="every 1s"' in html and 'value="40"' in html
    LabRun.objects.filter(pk=run.pk).update(state=RunState.FAILED, error="boom")
    response = alice_client.get(run.get_absolute_url(), **HTMX)
    assert response.status_code == 286  # htmx stops polling
    assert "boom" in response.content.decode()
    assert "hx-trigger" not in response.content.decode()


def test_the_run_page_says_vllm_is_starting_then_ready_and_nothing_for_a_sim_run(
    alice_client, alice
):
    from labs.backends.base import Phase
    from labs.backends.sim import SimBackend
    from labs.parameters.params import parse_lab_params

    run = make_run(alice, backend="vllm", state=RunState.RUNNING, heartbeat_at=timezone.now())
    on_progress = execution._progress_reporter(run.pk, execution._RunHeartbeat(run.pk, 60))
    on_progress(0.0, Phase("starting", "vLLM", "engine arguments changed", 34.2, 41.0))
    html = alice_client.get(run.get_absolute_url(), **HTMX).content.decode()
    assert (
        '<p id="run-phase" class="run-phase">Starting vLLM (engine arguments changed): 34 s so '
        "far; the last start on this worker took 41 s.</p>"
    ) in html
    # Requests begin: the start note gives way to how the server came to be ready.
    on_progress(0.0, Phase("ready", "vLLM", "same engine arguments", reused=True))
    html = alice_client.get(run.get_absolute_url(), **HTMX).content.decode()
    assert "Starting vLLM" not in html
    assert "vLLM ready: reused the running server (same engine arguments)." in html
    # Once the run has ended, only its result is shown.
    LabRun.objects.filter(pk=run.pk).update(state=RunState.FAILED, error="boom")
    assert 'id="run-phase"' not in alice_client.get(run.get_absolute_url()).content.decode()

    # A simulated run reports fractions only: its page never has a phase note.
    sim = make_run(alice, state=RunState.RUNNING, heartbeat_at=timezone.now())
    SimBackend().run(
        parse_lab_params(SMALL),
        execution._progress_reporter(sim.pk, execution._RunHeartbeat(sim.pk, 60)),
    )
    sim.refresh_from_db()
    assert sim.progress == 1.0 and sim.phase == {}
    html = alice_client.get(sim.get_absolute_url(), **HTMX).content.decode()
    assert 'value="100"' in html and 'id="run-phase"' not in html


def test_watching_a_run_whose_worker_died_shows_it_failed(alice_client, alice, settings):
    settings.LABS_RUN_STALE_S = 10
    run = make_run(
        alice,
        state=RunState.RUNNING,
        worker="sim@gone",
        heartbeat_at=timezone.now() - timedelta(seconds=11),
    )
    response = alice_client.get(run.get_absolute_url(), **HTMX)
    assert response.status_code == 286
    assert "sim@gone stopped sending heartbeats" in response.content.decode()


def test_another_learners_run_sweep_and_cancel_are_404(client, alice, done_run):
    bob = make_user("bob")
    client.force_login(bob)
    sweep = Sweep.objects.create(owner=alice, lab="batching", backend="sim", field="x", values=[1])
    assert client.get(done_run.get_absolute_url()).status_code == 404
    assert client.get(done_run.get_absolute_url(), **HTMX).status_code == 404
    assert client.post(reverse("labs:run-cancel", args=[done_run.pk])).status_code == 404
    assert client.get(sweep.get_absolute_url()).status_code == 404
    mine = make_run(bob)
    compare = reverse("labs:run-compare") + f"?a={mine.pk}&b={done_run.pk}"
    assert client.get(compare).status_code == 404


def test_cancel_a_running_run_from_its_page(alice_client, alice):
    run = make_run(alice, state=RunState.RUNNING, heartbeat_at=timezone.now())
    response = alice_client.post(reverse("labs:run-cancel", args=[run.pk]), **HTMX)
    assert response.status_code == 286
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    assert "Cancelled" in response.content.decode()


def test_history_and_compare_two_runs(alice_client, alice, done_run):
    other = make_run(alice, lab="paged-kv", params={**done_run.params, "block_size": 64})
    response = alice_client.get(reverse("labs:run-list"))
    assert response.status_code == 200
    html = response.content.decode()
    assert f"#{done_run.pk}" in html and f"#{other.pk}" in html
    response = alice_client.get(reverse("labs:run-compare"), {"a": done_run.pk, "b": other.pk})
    assert response.status_code == 200
    assert ("block_size", 16, 64) in response.context["changed"]
    assert any(r["label"] == "TTFT, mean" for r in response.context["rows"])


def test_a_sweep_from_the_lab_page(alice_client, alice, no_broker):
    make_heartbeat("sim")
    response = alice_client.post(
        reverse("labs:sweep-create", args=["batching"]),
        {"backend": "sim", "sweep_field": "max_num_seqs", "sweep_values": "1, 4, 16"},
    )
    sweep = Sweep.objects.get()
    assert response.status_code == 302 and response["Location"] == sweep.get_absolute_url()
    assert sweep.runs.count() == 3
    page = alice_client.get(sweep.get_absolute_url())
    assert page.status_code == 200
    assert 'id="sweep-chart"' in page.content.decode()
    poll = alice_client.get(sweep.get_absolute_url(), **HTMX)
    assert poll.status_code == 200 and 'hx-trigger="every 1s"' in poll.content.decode()


def test_a_bad_sweep_value_is_400_naming_it(alice_client, no_broker):
    make_heartbeat("sim")
    response = alice_client.post(
        reverse("labs:sweep-create", args=["batching"]),
        {"backend": "sim", "sweep_field": "max_num_seqs", "sweep_values": "1, 0"},
    )
    assert response.status_code == 400
    assert "sweep value 0: max_num_seqs must be" in response.content.decode()
    assert not Sweep.objects.exists()


def test_a_long_output_in_a_lab_without_max_tokens_runs(alice_client, no_broker):
    """Batching does not show max_tokens (its hidden value is 512): output_tokens 1000 must not
    be refused by it."""
    make_heartbeat("sim")
    assert "max_tokens" not in LABS["batching"].fields
    data = {"backend": "sim", "output_tokens": "1000", "max_tokens": "512", "num_prompts": "8"}
    response = alice_client.post(reverse("labs:run-create", args=["batching"]), data)
    assert response.status_code == 302, response.context["form"].errors
    assert LabRun.objects.get().params["max_tokens"] == 1000
    sweep = alice_client.post(
        reverse("labs:sweep-create", args=["speculative"]),
        {**data, "sweep_field": "output_tokens", "sweep_values": "256, 2000"},
    )
    assert sweep.status_code == 302
    points = Sweep.objects.get().runs.order_by("sweep_index")
    assert [r.params["output_tokens"] for r in points] == [256, 2000]
    assert points[1].params["max_tokens"] == 2000


def test_a_refusal_of_a_hidden_setting_lands_on_the_shown_one_it_follows(alice_client, no_broker):
    make_heartbeat("sim")
    response = alice_client.post(
        reverse("labs:run-create", args=["batching"]),
        {"backend": "sim", "prompt_tokens": "8000", "output_tokens": "1000"},
    )
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "max_tokens" not in errors
    assert "must fit llama-3-8b's context of 8,192 tokens" in errors["output_tokens"][0]
    assert "max_tokens is not shown here; it follows output_tokens" in errors["output_tokens"][0]
    assert not LabRun.objects.exists()


def test_a_run_whose_worker_died_counts_only_the_time_it_was_worked_on(alice_client, alice):
    """Ctrl-C on the worker at 6 s; the reaper fails the run 60 s of silence later."""
    started = timezone.now() - timedelta(seconds=78)
    run = make_run(
        alice,
        state=RunState.RUNNING,
        started_at=started,
        heartbeat_at=started + timedelta(seconds=6),
        worker="sim@gone",
    )
    assert reaping.run_reap_stale(run_ids=[run.pk]) == 1
    run.refresh_from_db()
    assert run.finished_at - run.started_at >= timedelta(seconds=78)
    assert run.duration == timedelta(seconds=6)
    html = alice_client.get(run.get_absolute_url()).content.decode()
    took = re.search(r'class="muted small run-took"[^>]*>([^<]*)<', html).group(1)
    assert took == "worked on for 6.0 s of wall-clock time before its worker stopped"


def test_a_run_that_failed_on_a_live_worker_counts_until_it_failed(alice_client, alice):
    started = timezone.now() - timedelta(seconds=20)
    run = make_run(alice, state=RunState.RUNNING, started_at=started, heartbeat_at=started)
    execution.run_fail(run_id=run.pk, error="The run took longer than the worker's time limit.")
    run.refresh_from_db()
    assert not run.worker_died
    assert run.duration == run.finished_at - run.started_at
    assert "took 20." in alice_client.get(run.get_absolute_url()).content.decode()


def test_a_lab_links_to_the_cards_whose_presets_open_it(alice_client):
    from tests.quiz.factories import make_card

    make_card(slug="paged-blocks-demo", lab_preset="block-waste-1000-tokens")
    make_card(slug="about-batching", lab_preset="batching-llama3-8b-h100-batch-1")
    html = alice_client.get(reverse("labs:lab-detail", args=["paged-kv"])).content.decode()
    assert reverse("quiz:card-detail", args=["paged-blocks-demo"]) in html
    assert reverse("labs:preset-open", args=["block-waste-1000-tokens"]) in html
    assert "about-batching" not in html


def _options(html: str, name: str) -> dict[str, str]:
    """value -> label of the <select name=...> options."""
    select = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', html, re.S)
    assert select, name
    return dict(re.findall(r'<option value="([^"]*)"[^>]*>([^<]*)</option>', select.group(1)))


def test_the_lab_page_offers_vllm_only_for_what_online_workers_can_run(alice_client):
    url = reverse("labs:lab-detail", args=["sandbox"])
    make_heartbeat("sim")
    html = alice_client.get(url).content.decode()
    assert "vllm" not in _options(html, "backend")  # no GPU worker online: not offered
    for kind, count in (("l4", 1), ("h100-sxm", 2)):
        make_heartbeat(
            "vllm", hostname=f"{kind}@box", gpus={"kind": kind, "count": count, "name": kind}
        )
    html = alice_client.get(url).content.decode()
    backends = _options(html, "backend")
    assert backends["vllm"] == "vLLM (GPU): h100-sxm \u00d72, l4 \u00d71"
    gpus = _options(html, "gpu")
    assert gpus["l4"] == "l4" and gpus["h100-sxm"] == "h100-sxm"
    assert gpus["a100-80gb"] == "a100-80gb (simulator only)"
    tps = _options(html, "tp")
    assert (tps["1"], tps["2"], tps["4"]) == ("1", "2", "4 (simulator only)")


def test_a_preset_no_worker_can_run_opens_on_the_simulator_saying_what_it_needs(alice_client):
    make_heartbeat("sim")
    make_heartbeat("vllm", hostname="l4@box", gpus={"kind": "l4", "count": 1, "name": "NVIDIA L4"})
    url = reverse("labs:lab-detail", args=["kv-capacity"]) + "?preset=kv-capacity-70b-tp4-8k"
    html = alice_client.get(url).content.decode()
    assert "On vLLM this preset needs a vLLM worker with 4\u00d7 h100-sxm" in html
    assert "so it runs on the simulator here" in html
    # The form starts on the simulator (the first choice, vLLM not selected).
    assert list(_options(html, "backend"))[0] == "sim"
    assert not re.search(r'<option value="vllm"[^>]*selected', html)


def test_a_preset_a_worker_elsewhere_would_run_does_not_say_it_runs_on_the_simulator(
    alice_client,
):
    make_heartbeat("sim")
    make_heartbeat("vllm", hostname="l4@box", gpus={"kind": "l4", "count": 1, "name": "NVIDIA L4"})
    # A worker measuring a server elsewhere (no device announced) takes the H100 run.
    make_heartbeat("vllm", hostname="remote@box", gpus={})
    url = reverse("labs:lab-detail", args=["kv-capacity"]) + "?preset=kv-capacity-70b-tp4-8k"
    html = alice_client.get(url).content.decode()
    assert "runs on the simulator here" not in html
    assert "(simulator only)" not in html
    response = alice_client.post(
        reverse("labs:run-create", args=["kv-capacity"]),
        {**_preset_form(html), "backend": "vllm"},
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert LabRun.objects.latest("pk").queue == "labs.gpu"


def _preset_form(html: str) -> dict[str, str]:
    """The lab form's values as the page filled them in (inputs and selected options)."""
    values = dict(re.findall(r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"', html))
    for name, body in re.findall(r'<select[^>]*name="([^"]+)"[^>]*>(.*?)</select>', html, re.S):
        chosen = re.search(r'<option value="([^"]*)"[^>]*selected', body)
        if chosen:
            values[name] = chosen.group(1)
    return {k: v for k, v in values.items() if k != "csrfmiddlewaretoken"}


def test_history_rows_show_the_settings_that_set_runs_apart(alice_client, alice, done_run):
    make_run(alice, lab="paged-kv", params={**done_run.params, "block_size": 64})
    html = alice_client.get(reverse("labs:run-list")).content.decode()
    rows = re.findall(r'<span class="run-settings small">(.*?)</span></td>', html, re.S)
    # Both paged-kv rows name block_size, each with its own value (not just "paged-kv").
    assert len(rows) == 2
    assert "block_size <strong>64</strong>" in rows[0]
    assert "block_size <strong>16</strong>" in rows[1]


def test_the_run_page_says_which_clock_each_time_is(alice_client, done_run):
    html = alice_client.get(done_run.get_absolute_url()).content.decode()
    took = re.search(r'<span class="muted small run-took"[^>]*>(.*?)</span>', html, re.S)
    assert took, "no duration on the run page"
    assert "s of wall-clock time to simulate" in took.group(1)
    assert "of GPU time" in took.group(1)


def _shown_text(html: str) -> str:
    """The page as read: tags and their attributes (a title's tooltip among them) dropped."""
    return re.sub(r"<[^>]+>", " ", html)


def test_the_long_provenance_is_shown_once_per_run_and_the_badge_is_short(
    alice_client, alice, done_run
):
    long = done_run.where
    assert long.startswith("simulated on CPU as H100 SXM (calibrated to ")
    short = "simulated · H100 SXM · calibrated"
    run_page = alice_client.get(done_run.get_absolute_url()).content.decode()
    # Once, under the badge, one click away; the caption, breakdown and charts say it short.
    assert _shown_text(run_page).count(long) == 1
    opener = r'<details class="where"><summary[^>]*><span class="badge where-badge sim">'
    assert re.search(opener, run_page)
    assert f"Measured ({short}) vs predicted" in run_page
    assert run_page.count("(simulated)</span></figcaption>") == 5

    other = make_run(alice, lab="paged-kv", params={**done_run.params, "block_size": 64})
    LabRun.objects.filter(pk=other.pk).update(state=RunState.DONE, where=long)
    for url, data in (
        (reverse("labs:run-list"), {}),
        (reverse("labs:run-compare"), {"a": done_run.pk, "b": other.pk}),
    ):
        html = alice_client.get(url, data).content.decode()
        assert long not in _shown_text(html), url  # in a tooltip only
        assert _shown_text(html).count(short) >= 2, url
    # Compare names both runs' provenance outside the table head, which a phone hides.
    meta = html.split('<p class="run-meta">', 1)[1].split("</p>", 1)[0]
    assert _shown_text(meta).count(short) == 2


def test_a_finished_run_shows_where_its_time_went_and_the_reading_names_the_largest_part(
    alice_client, done_run
):
    breakdown = done_run.result["breakdown"]
    assert breakdown["source"] == "simulated"
    assert breakdown["e2e_s"]["total"] == pytest.approx(done_run.result["e2e_s"]["mean"], rel=0.01)
    response = alice_client.get(reverse("labs:run-detail", args=[done_run.pk]))
    html = response.content.decode()
    assert "Where the time went" in html
    assert 'id="breakdown-e2e_s"' in html and 'id="breakdown-tpot_s"' in html
    parts = breakdown["e2e_s"]["parts"]
    largest = max(parts, key=parts.get)
    from labs.sim.breakdown import PART_LABELS

    reading = html.split('class="headline"', 1)[1].split("</p>", 1)[0]
    assert f"to {PART_LABELS[largest]}" in reading
    assert "calibrated to" in html  # the profile label on every simulated number


def test_the_lab_page_offers_both_simulator_profiles_and_carries_the_choice(alice_client):
    html = alice_client.get(reverse("labs:lab-detail", args=["batching"])).content.decode()
    assert 'name="sim_profile"' in html and 'value="ideal"' in html
    assert html.count('name="sim_profile"') == 1


def test_the_live_prediction_reacts_to_concurrency(alice_client):
    url = reverse("labs:lab-predict", args=["batching"])
    texts = []
    for concurrency in (32, 64):
        data = {**LABS["batching"].defaults, "max_num_seqs": 8, "concurrency": concurrency}
        response = alice_client.get(url, data, **HTMX)
        assert response.status_code == 200
        texts.append(response.content.decode())
    assert "under this load" in texts[0]
    assert texts[0] != texts[1]


def _point_broker_at(monkeypatch, url: str, transport_options: dict):
    from config.celery import app

    keys = ("broker_url", "CELERY_BROKER_URL", "broker_transport_options", "broker_transport")
    saved = {key: app.conf.get(key) for key in keys}
    # Celery reads the variable and the namespaced key before its own setting: point all at it.
    monkeypatch.setenv("CELERY_BROKER_URL", url)
    app.conf.update(
        broker_url=url,
        CELERY_BROKER_URL=url,
        broker_transport_options=transport_options,
        broker_transport=None,
    )
    app._pool = None
    app.amqp._producer_pool = None
    yield
    app.conf.update(saved)
    app._pool = None
    app.amqp._producer_pool = None


@pytest.fixture
def broker_down(monkeypatch):
    """CELERY_BROKER_URL pointing at a port nothing listens on, as when Redis is down."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the block ends
    yield from _point_broker_at(monkeypatch, f"redis://127.0.0.1:{port}/0", {})


@pytest.fixture
def broker_hung(monkeypatch):
    """CELERY_BROKER_URL pointing at a server that accepts connections and never answers (a hung
    Redis), with the transport options config/settings.py gives a Redis broker."""
    import ast
    import socket
    import threading

    from tests.config.test_env_file import settings_of

    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the server closed at teardown
            while True:
                held.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    url = f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    options = settings_of("", CELERY_BROKER_URL=url)["settings"]["CELERY_BROKER_TRANSPORT_OPTIONS"]
    yield from _point_broker_at(monkeypatch, url, ast.literal_eval(options))
    server.close()
    for conn in held:
        conn.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["run", "sweep"])
def test_a_submit_while_the_broker_is_down_is_503_and_leaves_nothing(client, broker_down, kind):
    user = make_user("carol")
    client.force_login(user)
    make_heartbeat("sim")
    data = {**SMALL, "backend": "sim"}
    if kind == "sweep":
        data.update(sweep_field="max_num_seqs", sweep_values="1, 2, 4")
    url = reverse(f"labs:{kind}-create", args=["batching"])
    response = client.post(url, data)
    assert response.status_code == 503
    assert "The lab queue is unavailable" in response.content.decode()
    assert not LabRun.objects.exists()
    assert not Sweep.objects.exists()


# Without socket timeouts the publish waits forever; the marker turns that into a failure.
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_a_submit_while_the_broker_hangs_is_503_and_leaves_nothing(client, broker_hung):
    client.force_login(make_user("carol"))
    make_heartbeat("sim")
    response = client.post(
        reverse("labs:run-create", args=["batching"]), {**SMALL, "backend": "sim"}
    )
    assert response.status_code == 503
    assert "The lab queue is unavailable" in response.content.decode()
    assert not LabRun.objects.exists()


def test_a_vllm_refusal_of_a_setting_the_lab_keeps_hidden_is_shown(alice_client, no_broker):
    """paged-kv carries gpu and tp as hidden inputs; a refusal of them must still be read."""
    make_heartbeat("sim")
    make_heartbeat("vllm", hostname="l4@box", gpus={"kind": "l4", "count": 1, "name": "NVIDIA L4"})
    response = alice_client.post(
        reverse("labs:run-create", args=["paged-kv"]), {"backend": "vllm", "gpu": "h100-sxm"}
    )
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "gpu" in errors and "gpu" not in LABS["paged-kv"].fields
    run_panel = response.content.decode().split('class="card run-panel"', 1)[1]
    assert errors["gpu"][0] in run_panel.replace("&#x27;", "'").replace("&quot;", '"')
    assert not LabRun.objects.exists()
    no_broker.assert_not_called()


def test_a_run_stored_with_its_breakdown_in_meta_too_still_shows_it(alice_client, done_run):
    # Runs stored before the breakdown was kept once have it in result["meta"] as well.
    result = done_run.result
    done_run.result = {**result, "meta": {**result["meta"], "breakdown": result["breakdown"]}}
    done_run.save()
    html = alice_client.get(done_run.get_absolute_url()).content.decode()
    assert html.count("Where the time went") == 1
    assert 'id="breakdown-e2e_s"' in html and 'id="breakdown-tpot_s"' in html


def test_the_batch_32_presets_run_explains_itself_with_its_own_table(
    alice_client, alice, no_broker
):
    """Issue 23's first case: the preset's run (0% prefix hits, fixed-length prompts) named
    prefix-cache hits as the cause. Now every named cause is a part whose sizes stand in the
    page's own breakdown, and the reading names the row with the largest shown difference."""
    make_heartbeat("sim")
    slug = "batching-llama3-8b-h100-batch-32"
    lab_page = alice_client.get(reverse("labs:lab-detail", args=["batching"]), {"preset": slug})
    form = {name: value for name, value in lab_page.context["form"].data.items()}
    alice_client.post(
        reverse("labs:run-create", args=["batching"]),
        {**form, "backend": "sim", "preset": slug},
    )
    run = LabRun.objects.get()
    assert execution.run_execute(run_id=run.pk, hostname="sim@test") == RunState.DONE
    run.refresh_from_db()
    assert run.result["prefix_cache_hit_rate"] == 0
    response = alice_client.get(run.get_absolute_url())
    html = response.content.decode()
    rows = {r.label: r for r in response.context["rows"]}
    assert "prefix" not in rows["TTFT, mean"].reading.lower()
    shown = [r for r in rows.values() if r.diff]
    largest = max(shown, key=lambda r: abs(r.shown_percent))
    reading = html.split('class="headline"', 1)[1].split("</p>", 1)[0]
    assert f"{largest.label} differs most ({largest.diff})" in reading
    legend = {
        (bar["key"], part["label"]): (part["value"], part["formula"])
        for bar in response.context["breakdown"]
        for part in bar["parts"]
    }
    keys = {"TTFT, mean": "ttft_s", "TPOT, mean": "tpot_s", "E2E latency, mean": "e2e_s"}
    for label, key in keys.items():
        row = rows[label]
        assert row.explanation.causes, row.reading
        for cause in row.explanation.causes:
            part = PART_LABELS[cause.key]
            ran, formula = legend[(key, part)]
            # "(run 4.61 ms, formula 0 ms)" in the reason; the same figures in the legend.
            assert f"{part} (run {ran}" in row.reading
            assert formula == "0 ms" or f"formula {formula}" in row.reading
    # The preset is decode-heavy now (1,024-token prompts, 2,048 output tokens), so what is left
    # of the gap to the formula is kernel efficiency, not prefill.
    assert "efficiency loss" in rows["Output tokens/s"].reading


def _run_lab(alice_client, lab: str, values: dict[str, object]):
    """Submit `values` over the lab page's own form, run it in-process, return the run page."""
    make_heartbeat("sim")
    page = alice_client.get(reverse("labs:lab-detail", args=[lab]))
    form = {**dict(page.context["form"].data.items()), **values, "backend": "sim"}
    assert alice_client.post(reverse("labs:run-create", args=[lab]), form).status_code == 302
    run = LabRun.objects.order_by("-pk").first()
    assert execution.run_execute(run_id=run.pk, hostname="sim@test") == RunState.DONE
    return alice_client.get(run.get_absolute_url())


def _rows_and_reading(response) -> tuple[dict, str]:
    html = response.content.decode()
    reading = html.split('class="headline"', 1)[1].split("</p>", 1)[0]
    return {r.label: r for r in response.context["rows"]}, reading.replace("&#x27;", "'")


def test_the_batching_lab_shows_the_token_budget_and_a_run_it_holds_names_it(
    alice_client, no_broker
):
    """Issue 50's first run, with 400 prompts instead of 2,000: 4,096-token prompts on a
    2,048-token budget run 64 at once of max_num_seqs 256, the KV pool at 62.5%. The page said
    requests "waited for a free slot (max_num_seqs, KV blocks)"."""
    lab_page = alice_client.get(reverse("labs:lab-detail", args=["batching"])).content.decode()
    assert 'name="max_num_batched_tokens"' in lab_page
    values = {"max_num_seqs": 256, "concurrency": 256, "num_prompts": 400, "prompt_tokens": 4096}
    response = _run_lab(alice_client, "batching", {**values, "output_tokens": 128})
    rows, reading = _rows_and_reading(response)
    held = (
        "the step's token budget (max_num_batched_tokens 2,048) admits half a 4,096-token "
        "prompt per step: 64 ran at once; max_num_seqs 256 and the KV pool (peak 62.5%) never "
        "bound"
    )
    # The formulas count the prompt a full chunked step runs into: 64, as the run; nothing
    # left for the running row to explain, the TTFT row and the headline still name the cap.
    running = rows["Running sequences, peak"]
    assert running.predicted == running.measured == "64" and running.reading == ""
    ttft = rows["TTFT, mean"]
    assert held[1:] in ttft.reading and ttft.explanation.limit.key == "token_budget"
    assert held[1:] in reading
    assert "free slot" not in response.content.decode()
    assert ("max_num_batched_tokens", 2048) in response.context["shown_params"]


def test_chunked_prefill_off_names_the_budget_that_takes_a_prompt_only_whole(
    alice_client, no_broker
):
    """Issue 50's second run: chunked prefill off at max_num_batched_tokens 4,096, the lab's
    4,096-token prompts: one request at a time (running peak 1 of 256, KV 0.99%)."""
    values = {"chunked_prefill": "false", "max_num_batched_tokens": 4096, "num_prompts": 16}
    rows, reading = _rows_and_reading(_run_lab(alice_client, "chunked-prefill", values))
    held = (
        "he step's token budget (max_num_batched_tokens 4,096, chunked prefill off) takes a "
        "4,096-token prompt only whole, so only into a step with nothing else: 1 ran at once; "
        "max_num_seqs 256 and the KV pool (peak 0.99%) never bound"
    )
    assert held in rows["TTFT, mean"].reading and held in reading
    assert "ramp-up and drain" not in rows["Output tokens/s"].reading


def test_a_real_run_on_a_device_without_a_calibration_says_so_and_sizes_no_part(
    alice_client, alice
):
    """Issue 50: a CPU vLLM run before its own calibration named parts 5-12x the gap they
    explained, and nothing said the device was not calibrated."""
    from labs.explanation.results import UNCALIBRATED_NOTE
    from labs.measurement.metrics import summarize
    from labs.parameters.params import parse_lab_params
    from labs.prediction.predict import lab_prediction
    from labs.sim.lab import run_breakdown
    from tests.labs.factories import gpu_record_slower_than_the_model

    cpu = {"gpu": "cpu", "hbm_gb": 16, "bandwidth_tbs": 0.0112, "tflops": 0.0197}
    params = parse_lab_params(
        {**SMALL, **cpu, "model": "lab-llama-20m", "concurrency": 4, "max_num_seqs": 8}
    )
    record = gpu_record_slower_than_the_model(params, 1.5)
    for sample in record.samples:
        sample.scheduled_tokens = None  # vLLM's gauges do not report it
    summary = summarize(record)
    summary["breakdown"] = run_breakdown(params, record, summary)
    assert summary["breakdown"]["calibrated"] is False
    run = make_run(
        alice,
        backend="vllm",
        params=params.as_dict(),
        state=RunState.DONE,
        result=summary,
        predicted=lab_prediction(params),
        where="vLLM on CPU",
    )
    response = alice_client.get(run.get_absolute_url())
    rows, reading = _rows_and_reading(response)
    # Said once, first; the rows it covers are not repeated in the reading.
    assert reading.split("</strong>", 1)[1].strip().startswith(UNCALIBRATED_NOTE)
    assert "sizes none of the parts" not in reading
    for label in ("TTFT, mean", "TPOT, mean", "E2E latency, mean", "Output tokens/s"):
        row = rows[label]
        assert row.measured and row.predicted and row.diff, label
        assert not row.explanation.causes and "not calibrated on this device" in row.reading
        assert row.explanation.rest == pytest.approx(row.explanation.difference)


# -- staff: calibrate a device -------------------------------------------------------------------


def _cpu_worker():
    from tests.labs.vllm.test_cpu import CPU_GPUS

    return make_heartbeat("vllm", hostname="cpu@box", queue="labs.gpu.cpu", gpus=CPU_GPUS)


CPU_KEY = "cpu:Intel(R) Xeon(R) Test CPU:2"


@pytest.fixture
def staff_client(client):
    client.force_login(make_user("root", is_staff=True))
    return client


@pytest.fixture
def calibration_sent():
    from labs.tasks import calibrate_device_task

    with mock.patch.object(calibrate_device_task, "apply_async") as apply_async:
        yield apply_async


def test_the_devices_page_is_for_staff_only(alice_client, calibration_sent):
    from django.test import Client

    url = reverse("labs:devices")
    response = Client().get(url)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert alice_client.get(url).status_code == 403
    _cpu_worker()
    response = alice_client.post(reverse("labs:device-calibrate"), {"device": CPU_KEY})
    assert response.status_code == 403
    calibration_sent.assert_not_called()
    assert "Calibrate a vLLM worker" not in alice_client.get(reverse("labs:index")).content.decode()


def test_staff_see_each_devices_calibration_and_its_points(staff_client):
    from labs.models import DeviceCalibration

    _cpu_worker()
    DeviceCalibration.objects.create(
        device=CPU_KEY,
        constants={
            "bandwidth_efficiency": 0.6,
            "kv_bandwidth_efficiency": 0.5,
            "gemm_efficiency": 1.0,
            "decode_step_overhead_s": 0.004,
            "mixed_step_overhead_s": 0.006,
        },  # fmt: skip
        fit_error=0.021,
        held_out_error=0.043,
        points=[
            {
                "id": "D1",
                "role": "fit",
                "what": "batch-1 decode",
                "metric": "e2e_s.mean",
                "measured": 0.1234567,
                "predicted": 0.13,
                "error": 0.053,
            }
        ],  # fmt: skip
    )
    assert "Calibrate a vLLM worker" in staff_client.get(reverse("labs:index")).content.decode()
    response = staff_client.get(reverse("labs:devices"))
    html = response.content.decode()
    assert response.status_code == 200
    assert "Intel(R) Xeon(R) Test CPU, 2 cores (CPU)" in html and CPU_KEY in html
    today = timezone.localdate().isoformat()
    assert f"calibrated on this worker, {today}, held-out error 4%" in html
    assert "fit error 2%" in html
    for cell in ("D1", "batch-1 decode", "e2e_s.mean", "0.12346", "0.13", "+5.3%"):
        assert f">{cell}<" in html, cell
    assert 'class="table-wrap"' in html  # a phone scrolls the points table sideways
    assert "Calibrate this device" in html and "csrfmiddlewaretoken" in html


def test_a_finished_jobs_line_says_how_long_that_job_took(staff_client):
    from labs.models import CalibrationJob, RunState

    _cpu_worker()
    started = timezone.now() - timezone.timedelta(minutes=10)
    CalibrationJob.objects.create(
        device=CPU_KEY,
        queue="labs.gpu.cpu.x1",
        base={},
        repeats=5,
        rounds=6,
        state=RunState.DONE,
        started_at=started,
        finished_at=started + timezone.timedelta(minutes=3, seconds=10),
    )
    html = staff_client.get(reverse("labs:devices")).content.decode()
    assert ", took 3\xa0minutes</span>" in html


def test_with_no_vllm_worker_online_the_page_says_how_to_start_one(staff_client):
    html = staff_client.get(reverse("labs:devices")).content.decode()
    assert "No vLLM worker is online" in html
    assert "LABS_VLLM_DEVICE=cpu celery -A config worker -Q labs.gpu --pool=solo" in html


def test_calibrate_queues_a_job_on_the_devices_worker_and_refuses_a_second_press(
    staff_client, calibration_sent, django_capture_on_commit_callbacks
):
    from labs.models import CalibrationJob

    _cpu_worker()
    url = reverse("labs:device-calibrate")
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post(url, {"device": CPU_KEY}, follow=True)
    job = CalibrationJob.objects.get()
    assert response.redirect_chain == [(reverse("labs:devices"), 302)]
    html = response.content.decode()
    assert f"Calibration of {CPU_KEY} queued" in html
    assert "Latest calibration job" in html and "state-queued" in html
    assert "every 5s" in html  # the page polls while a job is queued or running
    calibration_sent.assert_called_once()
    assert calibration_sent.call_args.kwargs["args"] == [job.pk]
    assert calibration_sent.call_args.kwargs["queue"] == "labs.gpu.cpu.x1"
    assert job.base == {
        "model": "lab-llama-20m",
        "gpu": "cpu",
        "block_size": 128,
        "kv_capacity_tokens": 8192,
        "max_num_seqs": 8,
        "hbm_gb": pytest.approx(17.179869184),
        "bandwidth_tbs": pytest.approx(0.008),
        "tflops": pytest.approx(0.2),
    }

    calibration_sent.reset_mock()
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post(url, {"device": CPU_KEY})
    assert response.status_code == 409
    assert "already queued or running, so nothing was queued" in response.content.decode()
    assert CalibrationJob.objects.count() == 1
    calibration_sent.assert_not_called()

    # The poll: the job's state alone, and htmx told to stop once it has ended.
    assert staff_client.get(reverse("labs:devices"), **HTMX).status_code == 200
    CalibrationJob.objects.update(state=RunState.FAILED, error="RuntimeError: vLLM exited")
    response = staff_client.get(reverse("labs:devices"), **HTMX)
    assert response.status_code == 286 and "RuntimeError: vLLM exited" in response.content.decode()


def test_calibrating_an_unknown_device_is_refused_not_an_error(staff_client, calibration_sent):
    response = staff_client.post(reverse("labs:device-calibrate"), {"device": "<b>h100</b>"})
    assert response.status_code == 503
    assert "No online vLLM worker can calibrate" in response.content.decode()
    assert "<b>h100</b>" not in response.content.decode()
    calibration_sent.assert_not_called()
    assert staff_client.get(reverse("labs:device-calibrate")).status_code == 405


@pytest.mark.django_db(transaction=True)
def test_calibrate_while_the_broker_is_down_says_so_and_fails_the_job(client, broker_down):
    from labs.models import CalibrationJob

    client.force_login(make_user("root", is_staff=True))
    _cpu_worker()
    response = client.post(reverse("labs:device-calibrate"), {"device": CPU_KEY})
    assert response.status_code == 503
    html = response.content.decode()
    assert "The lab queue is unavailable right now, so nothing was queued" in html
    job = CalibrationJob.objects.get()
    assert job.state == RunState.FAILED and "never sent" in job.error
    assert "The calibration failed." in html  # the page shows the job's state and reason


def test_each_finished_sweep_point_says_why_as_its_run_page_does(alice_client, alice, done_run):
    # The sweep page had the figures of each point but not the run page's reading of them.
    sweep = Sweep.objects.create(
        owner=alice, lab="paged-kv", backend="sim", field="block_size", values=[16, 32]
    )
    done_run.sweep, done_run.sweep_index = sweep, 0
    done_run.save()
    make_run(alice, lab="paged-kv", sweep=sweep, sweep_index=1, state=RunState.QUEUED)
    run_page = alice_client.get(done_run.get_absolute_url())
    sweep_page = alice_client.get(sweep.get_absolute_url())
    reading = run_page.context["headline"]
    assert reading and sweep_page.context["whys"] == [reading, ""]
    html = sweep_page.content.decode()
    assert html.count('class="why-row"') == 1 and "Why, at block_size = 16" in html
