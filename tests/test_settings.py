"""TORCHTPU_* settings are checked when torchtpu loads: a bad value is a ValueError naming the
variable and what it accepts, from `import torchtpu` and from the first use of the device
after `import torch` autoloaded torchtpu (which only warns, so CPU work goes on)."""
import os

import pytest

import utils
from torchtpu import _settings

BAD = [
    ("TORCHTPU_MAX_PENDING_OPS", "0", "use a positive integer"),
    ("TORCHTPU_MAX_PENDING_OPS", "-1", "use a positive integer"),
    ("TORCHTPU_MAX_PENDING_OPS", "many", "use a positive integer"),
    ("TORCHTPU_NUM_DEVICES", "0", "use a positive integer"),
    ("TORCHTPU_NUM_DEVICES", "-2", "use a positive integer"),
    ("TORCHTPU_MODE", "fast", "use one of debug, strict, fused"),
    ("TORCHTPU_FALLBACK", "loud", "use one of warn, error, silent"),
    ("TORCHTPU_BUCKETS", "64,abc", 'use "pow2", "off" or increasing sizes'),
    ("TORCHTPU_BUCKETS", "0,8", "sizes must be positive"),
    ("TORCHTPU_PLATFORM", "gpu", "valid platforms are cpu, cuda, tpu"),
    ("TORCHTPU_COMPILE_REPLAY", "yes", "use one of 1, 0"),
    ("TORCHTPU_EXPLAIN", "add", "'add' is not an op name like \"aten::add\""),
    ("TORCHTPU_EXPLAIN", "aten::add,aten::no_such_op", "'aten::no_such_op' is not an op of this torch"),
    ("TORCHTPU_EXPLAIN", "aten::add.NoSuchOverload", "'aten::add.NoSuchOverload' is not an op of this torch"),
    ("TORCHTPU_EXPLAIN", "all,aten::add", "'all' is not an op name"),
]


@pytest.mark.parametrize("name, value, allowed", BAD, ids=[f"{n}={v}" for n, v, _ in BAD])
def test_a_bad_value_names_the_variable_and_what_it_accepts(name, value, allowed):
    with pytest.raises(ValueError, match=f"^{name}='{value}' is not (valid|a platform)") as error:
        _settings.read({name: value})
    assert allowed in str(error.value)


def test_directories_must_be_directories(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    for name in ("TORCHTPU_CACHE_DIR", "TORCHTPU_DUMP_DIR"):
        for path in (a_file, a_file / "below"):
            with pytest.raises(ValueError, match=f"^{name}=.* is not valid: {a_file} is not a directory"):
                _settings.read({name: str(path)})
    fresh = _settings.read({"TORCHTPU_CACHE_DIR": str(tmp_path / "new" / "cache"), "TORCHTPU_DUMP_DIR": ""})
    assert fresh.cache_dir == str(tmp_path / "new" / "cache") and fresh.dump_dir == ""


def test_good_values_and_defaults():
    s = _settings.read({"TORCHTPU_MODE": " Strict ", "TORCHTPU_FALLBACK": "error", "TORCHTPU_NUM_DEVICES": "4",
                        "TORCHTPU_MAX_PENDING_OPS": "500", "TORCHTPU_PLATFORM": "CPU", "TORCHTPU_CACHE_DIR": ""})
    assert (s.mode, s.fallback, s.num_devices, s.max_pending_ops, s.platform, s.cache_dir) == (
        "strict", "error", 4, 500, "cpu", "")
    d = _settings.read({})
    assert (d.mode, d.fallback, d.num_devices, d.max_pending_ops, d.platform) == ("fused", "warn", 1, None, "")
    assert d.cache_dir == os.path.join(os.path.expanduser("~"), ".cache", "torchtpu")
    assert d.explain == ()
    assert _settings.read({"TORCHTPU_EXPLAIN": " all "}).explain == ("all",)
    assert _settings.read({"TORCHTPU_EXPLAIN": "aten::add, aten::mul.Tensor,torchtpu::scalar"}).explain == (
        "aten::add", "aten::mul.Tensor", "torchtpu::scalar")


def test_after_autoload_the_first_tpu_use_raises_the_setting_error():
    result = utils.run_python("""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        print("warned:", any("TORCHTPU_MAX_PENDING_OPS" in str(w.message) for w in caught))
        print("cpu:", (torch.ones(2) + 1).tolist())
        for use in (lambda: torch.ones(1, device="tpu"), lambda: torch.zeros(2).to("tpu")):
            try:
                use()
            except ValueError as e:
                print("use:", e)
        try:
            import torchtpu
        except ValueError as e:
            print("import:", e)
    """, timeout=300, TORCHTPU_MAX_PENDING_OPS="0")
    assert result.returncode == 0, result.stderr
    expected = "TORCHTPU_MAX_PENDING_OPS='0' is not valid; use a positive integer"
    assert result.stdout.splitlines() == [
        "warned: True", "cpu: [2.0, 2.0]",
        f"use: torchtpu could not start, so the tpu device is unavailable: {expected}",
        f"use: torchtpu could not start, so the tpu device is unavailable: {expected}",
        f"import: {expected}"]
