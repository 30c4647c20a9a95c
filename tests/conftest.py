"""Test setup: every test runs in each eager mode unless it asks for specific ones with
@pytest.mark.modes("fused", ...). The CPU result is the oracle."""
import os
import tempfile

# A private compilation cache per test session, so runs never depend on each other.
os.environ.setdefault("TORCHTPU_CACHE_DIR", tempfile.mkdtemp(prefix="torchtpu-test-cache-"))
os.environ.setdefault("TORCHTPU_FALLBACK", "warn")

import pytest  # noqa: E402
import torch  # noqa: E402

import torchtpu  # noqa: E402

MODES = ("debug", "strict", "fused")


def pytest_configure(config):
    config.addinivalue_line("markers", "modes(*names): run the test only in these eager modes")
    config.addinivalue_line("markers", "jaxlib_only(reason): a feature only the jaxlib runtime has; under "
                            "TORCHTPU_RUNTIME=pjrt the test is excluded, with the reason")


# The runtime this session's processes get (read from the settings, without starting it).
RUNTIME = torchtpu._settings.read().runtime


def pytest_collection_modifyitems(config, items):
    # A run under TORCHTPU_RUNTIME=pjrt (`make test-pjrt`) excludes what only jaxlib serves, each
    # exclusion naming why; tests/test_pjrt_runtime.py checks that the pjrt route then says so.
    if RUNTIME != "pjrt":
        return
    for item in items:
        marker = item.get_closest_marker("jaxlib_only")
        if marker:
            item.add_marker(pytest.mark.skip(reason=f"jaxlib runtime only: {marker.args[0]}"))


def pytest_generate_tests(metafunc):
    if "mode" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("modes")
        modes = marker.args if marker else MODES
        metafunc.parametrize("mode", modes, indirect=True)


@pytest.fixture
def mode(request):
    with torchtpu.mode(request.param):
        yield request.param
    torchtpu.sync(wait=True)


@pytest.fixture(autouse=True)
def _all_tests_use_a_mode(request):
    # Tests that do not take `mode` run in the default (fused) mode.
    yield


@pytest.fixture(autouse=True)
def _seeded():
    # Every test starts from the same RNG state, so its random inputs do not depend on which
    # tests ran before it (a module-level manual_seed runs at collection, before any test, and
    # the suite's order then decided the inputs: a bf16 round() once met a halfway case).
    torch.manual_seed(0)
    yield
