#!/usr/bin/env python
"""Module and optimizer coverage: PyTorch's ModuleInfo (`module_db`) and OptimizerInfo
(`optim_db`) databases on "tpu" against CPU, in worker subprocesses (tools/op_coverage.py's
scheduler: a crash or hang is recorded for that entry and the worker restarted).

Modules (entries named as ModuleInfo names them, e.g. `nn.Linear`): for every float32 sample
of the ModuleInfo (its module_inputs_func, seeded with PyTorch's set_rng_seed, training mode),
the module is built on CPU under a fixed seed, a deepcopy is moved with `.to("tpu")`, both run
forward on copies of the sample's inputs; outputs and buffers are compared (forward), then the
gradients of the sum of the float outputs w.r.t. the float inputs and the parameters (backward).
Tolerance: the loosest float32 toleranceOverride PyTorch's TestModule grants the module, else
atol = rtol = 1e-5 (TestModule compares CPU and CUDA at assertEqual's float32 defaults, atol
1e-5, rtol 1.3e-6; rtol is widened to 1e-5 because a module chains several reductions, each
summed in XLA's own order). Random modules (whose two CPU runs
under different seeds differ) are compared on shapes and dtypes when values differ. Lazy
modules are moved before their first forward (they must materialize on tpu), then run again
with CPU's materialized weights loaded, so their values are compared.

Optimizers (entries `Name[i]` for OptimizerInfo config i of optim_inputs_func, plus
`Name[i].foreach`, `.fused` and `.sparse` where the OptimizerInfo supports the implementation
on CPU): a seeded model (Linear(5, 4) for dense gradients, Embedding(10, 4, sparse=True) for
sparse ones) built on CPU and deepcopied to tpu, STEPS steps with a closure (loss = sum of
squares of the output of fixed inputs), then the parameters, the param_groups' settings and
every optimizer-state entry are compared (at the modules' default tolerance). A float32 entry
that misses passes when tpu's parameters are at most twice as far from a float64 CPU run of the
same steps as CPU's float32 ones (LBFGS branches on vanishing dot products: CPU's own result moves
past the tolerance between MKL's AVX2 and AVX-512 paths). The `fwd` column holds the optimizer's status; `bwd` is n/a.

Statuses are op_coverage's: pass, fallback (passes but torchtpu.metrics.counters()
["fallback_ops"] grew), fail (first reason recorded), crash, timeout, n/a.

    PYTHONPATH=. .venv/bin/python tools/module_coverage.py                      # everything, every sample
    PYTHONPATH=. .venv/bin/python tools/module_coverage.py --kind modules --samples 2 --mode strict
    PYTHONPATH=. .venv/bin/python tools/module_coverage.py --only nn.Linear,Adam[0].fused -v
    PYTHONPATH=. .venv/bin/python tools/module_coverage.py --samples 2 --update-floor   # raise both floors
tests/test_moduleinfo.py runs it in fused mode with SAMPLES samples per module (see there).
"""
from __future__ import annotations

import argparse
import collections
import copy
import importlib.util
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_op_coverage():
    spec = importlib.util.spec_from_file_location("op_coverage", os.path.join(ROOT, "tools", "op_coverage.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


oc = _load_op_coverage()

SEED = oc.SEED
STEPS = 3  # optimizer steps: the first creates the state, later ones read it back
# Module tolerance where ModuleInfo grants none (see the docstring).
DEFAULT_ATOL = DEFAULT_RTOL = 1e-5
MODULE_TOLERANCE_CLASSES = {None, "TestModule"}
OPTIM_VARIANTS = ("foreach", "fused", "sparse")


def _optim_name(info) -> str:
    return info.optim_cls.__name__


def optim_entries(optim_db) -> dict:
    """{key: (OptimizerInfo, config index, variant)} for every config and implementation."""
    entries = {}
    for info in optim_db:
        configs = info.optim_inputs_func(device="cpu")
        for i, config in enumerate(configs):
            base = f"{_optim_name(info)}[{i}]"
            if info.only_supports_sparse_grads:
                entries[base] = (info, i, "sparse")
                continue
            entries[base] = (info, i, "")
            if "foreach" in info.supported_impls and "foreach" not in config.kwargs:
                entries[base + ".foreach"] = (info, i, "foreach")
            if ("fused" in info.supported_impls and "cpu" in info.supports_fused_on
                    and "fused" not in config.kwargs and not config.kwargs.get("differentiable")):
                entries[base + ".fused"] = (info, i, "fused")
            if info.supports_sparse and not config.kwargs.get("differentiable"):
                entries[base + ".sparse"] = (info, i, "sparse")
    return entries


# =========================================================================================
# Worker side.
# =========================================================================================

class _Worker(oc._Worker):
    def __init__(self):  # noqa: D401  (op_coverage's worker without op_db)
        import warnings

        warnings.filterwarnings("ignore")
        oc._stub_expecttest()
        import torch

        torch.set_num_threads(1)
        import torchtpu
        from torch.testing._internal.common_modules import module_db
        from torch.testing._internal.common_optimizers import optim_db

        self.torch = torch
        self.torchtpu = torchtpu
        self.modules = {info.name: info for info in module_db}
        self.optims = optim_entries(optim_db)
        self.atol = self.rtol = 0.0
        self.closeness = 0.0
        (torch.ones(2, device="tpu") + 1).cpu()

    def keys(self):
        return list(self.modules) + list(self.optims)

    def run_entry(self, key, samples, backward, progress):
        if key in self.modules:
            return self.run_module(self.modules[key], samples, backward, progress)
        return self.run_optim(*self.optims[key], progress)

    # ---- modules -------------------------------------------------------------------------

    def run_module(self, info, samples, backward, progress):
        torch = self.torch
        from torch.testing._internal.common_utils import set_rng_seed

        dtype = torch.float32
        result = {"fwd": "n/a", "bwd": "n/a", "reason": "", "bwd_reason": "", "fallback_fwd": {},
                  "fallback_bwd": {}, "samples_fwd": 0, "samples_bwd": 0, "random": False}
        if dtype not in info.dtypes:
            result["reason"] = "float32 not supported by the module (ModuleInfo dtypes)"
            return result
        atol, rtol, result["tolerance_from"] = oc.tolerance(info, dtype, MODULE_TOLERANCE_CLASSES)
        self.atol, self.rtol = max(atol, DEFAULT_ATOL), max(rtol, DEFAULT_RTOL)
        result["tolerance"] = {"atol": self.atol, "rtol": self.rtol}
        set_rng_seed(SEED)
        try:
            inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True, training=True)
        except Exception as error:  # noqa: BLE001
            result["reason"] = oc._error("n/a: module_inputs_func raised on CPU", error)
            return result
        if samples:
            inputs = inputs[:samples]
        fwd_fail = bwd_fail = None
        fwd_fallback, bwd_fallback = collections.Counter(), collections.Counter()
        fwd_closeness = bwd_closeness = 0.0
        cpu_errors = []
        forward_ran = 0  # samples whose tpu forward returned (matching or not): backward can run
        for index, sample in enumerate(inputs):
            if sample.forward_input is None:
                continue
            progress({"phase": "fwd", "sample": index})
            cargs, ckwargs = sample.constructor_input.args, sample.constructor_input.kwargs
            fargs, fkwargs = sample.forward_input.args, sample.forward_input.kwargs
            try:
                torch.manual_seed(SEED)
                # .to(dtype) as PyTorch's TestModule does (FractionalMaxPool's _random_samples buffer is float64)
                module = info.module_cls(*cargs, **ckwargs).to(dtype)
                tpu_module = copy.deepcopy(module)  # before any forward: lazy modules stay lazy
                module2 = copy.deepcopy(module)
                torch.manual_seed(1234)
                cpu_in = self.clone((fargs, fkwargs))
                expected = module(*cpu_in[0], **cpu_in[1])
                torch.manual_seed(4321)
                cpu_in2 = self.clone((fargs, fkwargs))
                expected2 = module2(*cpu_in2[0], **cpu_in2[1])
            except Exception as error:  # noqa: BLE001
                cpu_errors.append(oc._error("CPU reference raised", error))
                continue
            random = False
            try:
                if not info.is_lazy:  # a lazy module's weights come from the RNG at its first forward
                    self.compare(expected2, expected, on_tpu=False)
            except Exception:  # noqa: BLE001
                random = True
            result["random"] = result["random"] or random
            result["samples_fwd"] += 1
            before = self.fallbacks()
            self.closeness = 0.0
            actual = None
            try:
                tpu_module = tpu_module.to("tpu")
                tpu_in = self.to_tpu((fargs, fkwargs))
                torch.manual_seed(1234)
                actual = tpu_module(*tpu_in[0], **tpu_in[1])
                if info.is_lazy:
                    # It materialized on tpu from tpu's RNG (that it did is the lazy check); with
                    # CPU's weights loaded, its values can be compared too.
                    tpu_module.load_state_dict(module.state_dict())
                    tpu_in = self.to_tpu((fargs, fkwargs))
                    actual = tpu_module(*tpu_in[0], **tpu_in[1])
                self.compare_maybe_random(actual, expected, "out", random, result)
                for name, buffer in module.named_buffers():
                    self.compare_maybe_random(dict(tpu_module.named_buffers())[name], buffer, f"buffer {name}",
                                              random, result)
            except oc.Mismatch as error:
                fwd_fail = fwd_fail or oc._short(f"sample {index} ({sample.desc}): mismatch: {error}")
            except Exception as error:  # noqa: BLE001
                fwd_fail = fwd_fail or oc._short(f"sample {index} ({sample.desc}): " + oc._error("tpu raised", error))
                actual = None
                self.recover()
            fwd_fallback.update(self.diff(before, self.fallbacks()))
            fwd_closeness = max(fwd_closeness, self.closeness)
            if not backward or actual is None:
                continue
            forward_ran += 1
            progress({"phase": "bwd", "sample": index})
            cpu_wrt = [t for t in self.leaves(cpu_in) if t.requires_grad and t.is_floating_point()]
            cpu_wrt += [p for p in module.parameters() if p.requires_grad]
            try:
                cpu_total = self.float_total(expected)
                if cpu_total is None or not cpu_wrt:
                    continue
                cpu_grads = torch.autograd.grad(cpu_total, cpu_wrt, allow_unused=True)
            except Exception:  # noqa: BLE001
                continue  # CPU cannot differentiate this sample: not applicable
            result["samples_bwd"] += 1
            before = self.fallbacks()
            self.closeness = 0.0
            try:
                tpu_wrt = [t for t in self.leaves(tpu_in) if t.requires_grad and t.is_floating_point()]
                tpu_wrt += [p for p in tpu_module.parameters() if p.requires_grad]
                if len(tpu_wrt) != len(cpu_wrt):
                    raise oc.Mismatch(f"{len(tpu_wrt)} tpu tensors require grad, CPU {len(cpu_wrt)}")
                tpu_total = self.float_total(actual)
                if tpu_total is None:
                    raise oc.Mismatch("tpu output does not require grad")
                tpu_grads = torch.autograd.grad(tpu_total, tpu_wrt, allow_unused=True)
                for i, (a, e) in enumerate(zip(tpu_grads, cpu_grads)):
                    if (a is None) != (e is None):
                        raise oc.Mismatch(f"grad[{i}]: {'None' if a is None else 'tensor'} on tpu, "
                                          f"{'None' if e is None else 'tensor'} on CPU")
                    if e is not None:
                        self.compare_maybe_random(a, e, f"grad[{i}]", random, result)
            except oc.Mismatch as error:
                bwd_fail = bwd_fail or oc._short(f"sample {index} ({sample.desc}): mismatch: {error}")
            except Exception as error:  # noqa: BLE001
                bwd_fail = bwd_fail or oc._short(f"sample {index} ({sample.desc}): " + oc._error("tpu raised", error))
                self.recover()
            bwd_fallback.update(self.diff(before, self.fallbacks()))
            bwd_closeness = max(bwd_closeness, self.closeness)
        result["fallback_fwd"], result["fallback_bwd"] = dict(fwd_fallback), dict(bwd_fallback)
        if result["samples_fwd"] == 0:
            result["reason"] = oc._short("n/a: no sample ran on CPU: " + (cpu_errors[0] if cpu_errors else ""))
            return result
        if fwd_fail:
            result["fwd"], result["reason"] = "fail", fwd_fail
        else:
            result["fwd"] = "fallback" if fwd_fallback else "pass"
            result["closeness_fwd"] = round(fwd_closeness, 4)
            if result.get("random_values_differ"):
                result["reason"] = "random module: values differ from CPU's RNG; shapes/dtypes match"
        if not backward:
            result["bwd_reason"] = "backward not run"
        elif fwd_fail and not forward_ran:
            result["bwd"], result["bwd_reason"] = "fail", "forward raised on tpu for every sample"
        elif result["samples_bwd"] == 0:
            result["bwd_reason"] = "no differentiable float output in the tried samples"
        elif bwd_fail:
            result["bwd"], result["bwd_reason"] = "fail", bwd_fail
        else:
            result["bwd"] = "fallback" if bwd_fallback else "pass"
            result["closeness_bwd"] = round(bwd_closeness, 4)
        return result

    # ---- optimizers ----------------------------------------------------------------------

    def _optim_model(self, info, sparse):
        torch = self.torch
        torch.manual_seed(SEED)
        if sparse:
            model = torch.nn.Embedding(10, 4, sparse=True)
            data = torch.tensor([[1, 3, 3], [7, 0, 9]])
        else:
            # Muon updates matrices only (it rejects 1-d parameters).
            model = torch.nn.Linear(5, 4, bias=_optim_name(info) != "Muon")
            data = torch.randn(6, 5)
        return model, data

    def _optim_run(self, info, config, variant, model, data, device):
        torch = self.torch
        model = model.to(device)
        data = data.to(device)
        kwargs = self.clone(config.kwargs)  # a tensor lr stays on CPU, as PyTorch's own optimizer tests leave it
        if variant == "foreach":
            kwargs["foreach"] = True
        elif variant == "fused":
            kwargs["fused"] = True
        elif variant == "" and "foreach" in info.supported_impls and "foreach" not in kwargs \
                and not kwargs.get("fused"):
            kwargs["foreach"] = False  # the plain config is the per-tensor loop on both devices
        optimizer = info.optim_cls(model.parameters(), **kwargs)

        def closure():
            optimizer.zero_grad()
            loss = (model(data) ** 2).sum()
            loss.backward()
            return loss

        for _ in range(STEPS):
            optimizer.step(closure)
        return model, optimizer

    def _as_accurate_as_cpu(self, info, config, variant, sparse, cpu_model, tpu_model) -> str:
        """A float32 mismatch judged against a float64 CPU run: '' unless tpu's parameters are as close to it as CPU's own.

        Optimizers that branch on vanishing float32 dot products (LBFGS's curvature test and
        step ratios) amplify summation-order noise: CPU's own result moves by more than the
        elementwise tolerance when MKL takes its AVX2 instead of its AVX-512 path (LBFGS[2]:
        parameters 3.4e-5 apart, tpu vs CPU 1.1e-6). Such an entry passes when, against the
        same steps in float64, tpu's float32 error is at most twice CPU's float32 error (with
        a 1e-6 floor for entries where CPU is exact).
        """
        torch = self.torch
        try:
            model, data = self._optim_model(info, sparse)
            if sparse:
                return ""
            reference, _ = self._optim_run(info, config, variant, model.double(), data.double(), "cpu")
        except Exception:  # noqa: BLE001
            return ""
        worst = 0.0
        for (name, exact), cpu, tpu in zip(reference.named_parameters(), cpu_model.parameters(), tpu_model.parameters()):
            cpu_error = (cpu.detach().double() - exact.detach()).abs().max().item()
            tpu_error = (tpu.detach().cpu().double() - exact.detach()).abs().max().item()
            if not tpu_error <= 2 * cpu_error + 1e-6:
                return ""
            worst = max(worst, tpu_error / max(cpu_error, 1e-12))
        return f"as accurate as CPU against float64 (tpu/CPU error <= {worst:.2f})"

    def run_optim(self, info, config_index, variant, progress):
        torch = self.torch
        config = info.optim_inputs_func(device="cpu")[config_index]
        result = {"fwd": "n/a", "bwd": "n/a", "reason": "", "bwd_reason": "optimizer: no backward column",
                  "fallback_fwd": {}, "fallback_bwd": {}, "desc": config.desc, "kwargs": repr(config.kwargs),
                  "variant": variant or "default"}
        self.atol, self.rtol = DEFAULT_ATOL, DEFAULT_RTOL
        result["tolerance"] = {"atol": self.atol, "rtol": self.rtol}
        sparse = variant == "sparse"
        progress({"phase": "fwd"})
        try:
            model, data = self._optim_model(info, sparse)
            tpu_model = copy.deepcopy(model)
            cpu_model, cpu_optim = self._optim_run(info, config, variant, model, data, "cpu")
        except Exception as error:  # noqa: BLE001
            result["reason"] = oc._error("n/a: CPU raised", error)
            return result
        before = self.fallbacks()
        self.closeness = 0.0
        try:
            tpu_model, tpu_optim = self._optim_run(info, config, variant, tpu_model, data, "tpu")
            for (name, e), a in zip(cpu_model.named_parameters(), tpu_model.parameters()):
                self.compare(a, e, f"param {name}")
            # The settings too: the user's hyperparameters must come back as they were given.
            for i, (e_group, a_group) in enumerate(zip(cpu_optim.param_groups, tpu_optim.param_groups)):
                for name in e_group:
                    if name != "params":
                        self.compare(a_group.get(name), e_group[name], f"param_groups[{i}][{name!r}]", on_tpu=False)
            cpu_state, tpu_state = cpu_optim.state_dict()["state"], tpu_optim.state_dict()["state"]
            for index in cpu_state:
                if index not in tpu_state:
                    raise oc.Mismatch(f"state[{index}] missing on tpu")
                for name, e in cpu_state[index].items():
                    if name not in tpu_state[index]:
                        raise oc.Mismatch(f"state[{index}][{name!r}] missing on tpu")
                    # A state entry may stay on CPU on purpose (a step count of the non-capturable path).
                    self.compare(tpu_state[index][name], e, f"state[{index}][{name!r}]", on_tpu=False)
            result["fwd"] = "pass"
        except oc.Mismatch as error:
            result["fwd"], result["reason"] = "fail", oc._short(f"mismatch: {error}")
            accurate = self._as_accurate_as_cpu(info, config, variant, sparse, cpu_model, tpu_model)
            if accurate:
                result["fwd"], result["reason"] = "pass", oc._short(f"{accurate} (elementwise: {error})")
        except Exception as error:  # noqa: BLE001
            result["fwd"], result["reason"] = "fail", oc._error("tpu raised", error)
            self.recover()
        result["fallback_fwd"] = self.diff(before, self.fallbacks())
        if result["fwd"] == "pass":
            result["closeness_fwd"] = round(self.closeness, 4)
            if result["fallback_fwd"]:
                result["fwd"] = "fallback"
        return result


def worker_main(fd: int):
    worker = _Worker()
    oc.serve(fd, worker.keys(), lambda key, request, progress: worker.run_entry(
        key, request["samples"], request["backward"], progress))


# =========================================================================================
# Parent side.
# =========================================================================================

def is_module_key(key: str) -> bool:
    return key.startswith("nn.")


def list_keys(kind: str) -> list:
    """The entries of `kind` (modules, optims), without starting a device (imports torch)."""
    oc._stub_expecttest()
    if kind == "modules":
        from torch.testing._internal.common_modules import module_db

        return [info.name for info in module_db]
    from torch.testing._internal.common_optimizers import optim_db

    return list(optim_entries(optim_db))


def run(kind="all", only=None, samples=0, backward=True, timeout=300.0, jobs=1, mode="fused", verbose=False,
        log=None) -> dict:
    """Runs the entries; returns {"modules": data, "optims": data} (op_coverage's data layout)."""
    kinds = ("modules", "optims") if kind == "all" else (kind,)
    out = {}
    for k in kinds:
        keys = [key for key in (only or []) if is_module_key(key) == (k == "modules")] if only else list_keys(k)
        if only and not keys:
            continue
        data = oc.run(ops=keys, samples=samples, backward=backward, timeout=timeout, jobs=jobs, mode=mode,
                      verbose=verbose, log=log, script=__file__)
        data["meta"]["kind"] = k
        out[k] = data
    return out


FLOOR_PATHS = {"modules": os.path.join(ROOT, "tests", "module_floor.txt"),
               "optims": os.path.join(ROOT, "tests", "optim_floor.txt")}
FLOOR_COMMAND = "PYTHONPATH=. .venv/bin/python tools/module_coverage.py --samples 3 --update-floor"
FLOOR_DATABASES = {"modules": "ModuleInfo", "optims": "OptimizerInfo"}


def floor_header(kind: str) -> str:
    what = ("ModuleInfo modules (module_db) that pass on tpu against CPU. Columns: ModuleInfo name, sample\n"
            "# dtype, forward (outputs and buffers), backward (input and parameter gradients)"
            if kind == "modules" else
            "OptimizerInfo configs (optim_db) whose parameters and state match CPU's after a few steps\n"
            "# (or, float32 entries that miss, whose parameters are as close to a float64 CPU run as CPU's: LBFGS).\n"
            "# Columns: Name[i] (config i of optim_inputs_func) with .foreach / .fused / .sparse for that\n"
            "# implementation, dtype, status, and '-' (optimizers have no backward column)")
    return f"""\
# {what}; each status is the least the entry must keep (tests/test_moduleinfo.py fails naming any
# entry that no longer holds and warns listing the ones that pass better):
#   pass      matches CPU and nothing fell back to CPU
#   fallback  matches CPU, some aten ops ran on CPU
#   -         nothing held: fails, not applicable, or a near miss (an error above {oc.NEAR_MISS:g} of
#             the allowed one; the comment gives its closeness)
# Raise entries with one run (fused mode, 3 samples per module, as the test):
#   {FLOOR_COMMAND}
# It only raises entries; lowering one is a hand edit, with the reason in the commit.
"""


def compare_floor(kind: str, data: dict, path: str | None = None):
    return oc.compare_floor(oc.read_floor(path or FLOOR_PATHS[kind]), data, FLOOR_DATABASES[kind])


def update_floor(kind: str, data: dict, path: str | None = None) -> list:
    return oc.update_floor(data, path or FLOOR_PATHS[kind], floor_header(kind))


def failures(data: dict) -> list:
    """'key: direction: first reason' for every entry that fails, crashes or times out."""
    lines = []
    for key, record in data["ops"].items():
        for direction, reason in (("fwd", "reason"), ("bwd", "bwd_reason")):
            if record.get(direction) in ("fail", "crash", "timeout"):
                lines.append(f"{key}: {direction} {record[direction]}: {record.get(reason, '')[:240]}")
    return lines


def describe(kind: str, data: dict) -> str:
    s = data["summary"]
    f, b = s["forward"], s["backward"]
    if kind == "optims":
        return (f"optims: {s['ops_total']} configs, pass={f['pass']} fallback={f['fallback']} fail={f['fail']} "
                f"crash={f['crash']} timeout={f['timeout']} n/a={f['n/a']}, {data['meta']['runtime_s']}s")
    return (f"modules: {s['ops_total']} modules, fwd pass={f['pass']} fallback={f['fallback']} fail={f['fail']} "
            f"crash={f['crash']} timeout={f['timeout']} n/a={f['n/a']}; bwd pass={b['pass']} "
            f"fallback={b['fallback']} fail={b['fail']} n/a={b['n/a']}, {data['meta']['runtime_s']}s")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="all", choices=("all", "modules", "optims"))
    parser.add_argument("--only", help="comma-separated entries (nn.Name, Optim[i], Optim[i].foreach, ...)")
    parser.add_argument("--samples", type=int, default=0, help="sample inputs per module (default 0: all)")
    parser.add_argument("--no-backward", action="store_true", help="modules: forward only")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds per entry (default 300: nn.Transformer's every sample took 109 s)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--mode", default="fused", choices=("fused", "strict", "debug"))
    parser.add_argument("--json", help="write the full records here")
    parser.add_argument("--update-floor", action="store_true",
                        help="raise tests/module_floor.txt and tests/optim_floor.txt to what this run passes")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker)
    results = run(kind=args.kind, only=args.only.split(",") if args.only else None, samples=args.samples,
                  backward=not args.no_backward, timeout=args.timeout, jobs=args.jobs, mode=args.mode,
                  verbose=args.verbose)
    status = 0
    for kind, data in results.items():
        print(describe(kind, data))
        for line in failures(data):
            print("  " + line)
        if args.update_floor:
            gained = update_floor(kind, data)
            print(f"raised {len(gained)} entries of {FLOOR_PATHS[kind]}", file=sys.stderr)
            lost, _ = compare_floor(kind, data)
            if lost:
                print("held entries this run does not reach (kept):", *lost, sep="\n  ", file=sys.stderr)
                status = 1
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
            out.write("\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
