"""The load-generator benchmark runs against the same fake vLLM server as tests/labs/vllm/."""

from tests.labs.vllm.conftest import _idle_fakes, fake_server  # noqa: F401 (fixtures)
