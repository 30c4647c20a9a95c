"""Lightning: Trainer(accelerator="tpu") runs on torchtpu's device when torch_xla is absent.

Lightning's own extension point is its accelerator registry: a TPUAccelerator registered
there under "tpu" (in place of XLAAccelerator, which needs torch_xla) gives devices,
device setup and memory stats. Three choices Lightning makes in its accelerator connector
(a private class, hence the version check) know only CUDA/MPS/XLA and are extended here:
  - accelerator="auto" falls back to "cpu" after XLA/MPS/CUDA: it picks "tpu" instead when a
    tpu is available;
  - the strategy for "tpu" is XLA's: it is Lightning's SingleDeviceStrategy on tpu:N instead
    (several devices: DDP, as for CUDA);
  - "16-mixed"/"bf16-mixed" autocast on "cuda" unless the accelerator is cpu/mps: on tpu they
    autocast on "tpu".
The same applies to the standalone pytorch_lightning package (same code, other name).
"""
import functools
import importlib

import torch

from torchtpu import _patches
from torchtpu.integrations import check_version

SUPPORTED = ("2.1", "2.7")
TESTED = "2.6.6"


def _tpu_available() -> bool:
    return torch.tpu.is_available()


def _parse_devices(devices):
    """Lightning's `devices` argument -> tpu indices (int/"N": the first N; -1/"-1": all;
    a list or "0,2": those)."""
    count = torch.tpu.device_count()
    if isinstance(devices, str):
        text = devices.strip()
        if text in ("-1", "auto"):
            return list(range(count))
        if "," in text:
            devices = [int(part) for part in text.split(",") if part.strip()]
        else:
            devices = int(text)
    if isinstance(devices, int):
        if devices == -1:
            return list(range(count))
        if devices < 0 or devices > count:
            raise ValueError(f"Trainer(devices={devices}) asks for {devices} tpu devices; {count} present "
                             "(TORCHTPU_NUM_DEVICES sets how many the CPU platform exposes)")
        return list(range(devices)) or None
    indices = [int(index) for index in devices]
    bad = [index for index in indices if not 0 <= index < count]
    if bad:
        raise ValueError(f"tpu device indices {bad} do not exist; {count} present")
    return indices


def _make_accelerator(root: str):
    base = importlib.import_module(f"{root}.accelerators").Accelerator

    class TPUAccelerator(base):
        """torchtpu's "tpu" device (TPU, GPU or CPU through XLA) for Lightning."""

        def setup_device(self, device: torch.device) -> None:
            if device.type != "tpu":
                raise ValueError(f"Device should be tpu, got {device} instead")
            torch.tpu.set_device(device)

        def get_device_stats(self, device) -> dict:
            return torch.tpu.memory_stats(device)

        def teardown(self) -> None:
            pass

        @staticmethod
        def parse_devices(devices):
            return _parse_devices(devices)

        @staticmethod
        def get_parallel_devices(devices):
            return [torch.device("tpu", index) for index in devices]

        @staticmethod
        def auto_device_count() -> int:
            return torch.tpu.device_count()

        @staticmethod
        def is_available() -> bool:
            return _tpu_available()

        @staticmethod
        def name() -> str:
            return "tpu"

        @classmethod
        def register_accelerators(cls, accelerator_registry) -> None:
            accelerator_registry.register("tpu", cls, description=cls.__name__, override=True)

    TPUAccelerator.__module__ = __name__
    return TPUAccelerator


def install(module) -> None:
    root = module.__name__.split(".trainer.")[0]  # "lightning.pytorch" or "pytorch_lightning"
    package = importlib.import_module(root.split(".")[0])
    check_version(root.split(".")[0], package.__version__, SUPPORTED, TESTED)
    accelerators = importlib.import_module(f"{root}.accelerators")
    if accelerators.XLAAccelerator.is_available():
        return  # torch_xla is installed and sees a TPU: "tpu" stays Lightning's XLA route
    accelerator_class = _make_accelerator(root)
    accelerator_class.register_accelerators(accelerators.AcceleratorRegistry)
    _patches.apply(f"{root.split('.')[0]} accelerator connector", module, accelerator_class, root)


_CONNECTOR_CHOICES = ("_choose_auto_accelerator", "_choose_strategy", "_check_and_init_precision")


def _patch_connector(module, accelerator_class, root) -> None:
    name = f"{root.split('.')[0]} accelerator connector"
    connector = module._AcceleratorConnector
    strategies = importlib.import_module(f"{root}.strategies")
    precision = importlib.import_module(f"{root}.plugins.precision")
    choose_auto = _patches.checked(name, connector, "_choose_auto_accelerator", params=[])
    choose_strategy = _patches.checked(name, connector, "_choose_strategy", params=["self"])
    init_precision = _patches.checked(name, connector, "_check_and_init_precision", params=["self"])

    @functools.wraps(choose_auto)
    def _choose_auto_accelerator():
        choice = choose_auto()
        return "tpu" if choice == "cpu" and _tpu_available() else choice

    @functools.wraps(choose_strategy)
    def _choose_strategy(self):
        if not isinstance(self.accelerator, accelerator_class):
            return choose_strategy(self)
        if self._num_nodes_flag > 1 or len(self._parallel_devices) > 1:
            return "ddp"
        return strategies.SingleDeviceStrategy(device=self._parallel_devices[0])

    @functools.wraps(init_precision)
    def _check_and_init_precision(self):
        if (isinstance(self.accelerator, accelerator_class) and self._precision_plugin_flag is None
                and self._precision_flag in ("16-mixed", "bf16-mixed")):
            self._validate_precision_choice()
            return precision.MixedPrecision(self._precision_flag, "tpu")
        return init_precision(self)

    _patches._replace(connector, "_choose_auto_accelerator", _choose_auto_accelerator)
    _patches._replace(connector, "_choose_strategy", _choose_strategy)
    _patches._replace(connector, "_check_and_init_precision", _check_and_init_precision)


# The same code under two package names (lightning.pytorch and the standalone pytorch_lightning).
for _package, _root in (("lightning", "lightning.pytorch"), ("pytorch_lightning", "pytorch_lightning")):
    _module = f"{_root}.trainer.connectors.accelerator_connector"
    _patches.patch(f"{_package} accelerator connector", when=f"import of {_module}", library=_package,
                   targets=tuple(f"{_module}._AcceleratorConnector.{choice}" for choice in _CONNECTOR_CHOICES)
                   )(_patch_connector)
