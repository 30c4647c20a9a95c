"""torchtpu.explain(fn, *args): the route each op of a call takes through the tpu kernels.

    print(torchtpu.explain(lambda x: (x.view(2, 8) + 1).nonzero(), torch.ones(16, device="tpu")))

For every aten op that reaches the tpu device (after autograd and functionalization), one
line per route it took: lowered (by which rule, in which file; a view functionalization
copied), declined by its lowering (why, and whether CPU's kernel then raised its error or
computed it as a counted fallback), a view or in-place op below functionalization, a
data-dependent shape, the CPU fallback of an op without a lowering, one of the device's own
kernels (copies, .item()) or a JAX kernel (linear algebra). TORCHTPU_EXPLAIN=aten::op prints
the same lines as they happen (torchtpu/_settings.py). The routing code reports them itself
(csrc/device/explain.h), at no cost while nothing listens.
"""
from __future__ import annotations

import dataclasses

from torchtpu import _C


@dataclasses.dataclass(frozen=True)
class Route:
    op: str        # "aten::add.Tensor"
    route: str     # "lowered", "declined: ...", "no lowering: CPU fallback", ...
    detail: str    # the rule and its file, what CPU's kernel did, ...
    count: int     # calls that took this route

    def __str__(self):
        return f"{self.op}: {self.route}" + (f" ({self.detail})" if self.detail else "") + \
            (f" x{self.count}" if self.count > 1 else "")


@dataclasses.dataclass(frozen=True)
class Explanation:
    routes: list[Route]
    result: object  # what fn returned (None if it raised)
    error: BaseException | None = None  # what fn raised: the routes say where it came from

    def __str__(self):
        lines = [str(route) for route in self.routes] or ["no op reached the tpu device"]
        if self.error is not None:
            lines.append(f"raised {type(self.error).__name__}: {self.error}")
        return "\n".join(lines)

    def of(self, op: str) -> list[Route]:
        """The routes of one op ("aten::add.Tensor"), or of every overload ("aten::add")."""
        return [r for r in self.routes if r.op == op or r.op.startswith(op + ".")]


def explain(fn, *args, **kwargs) -> Explanation:
    """Calls fn(*args, **kwargs) and returns the route each op took, in the order first taken
    (its pending work runs before it returns, so that nothing is left half explained). An
    Exception fn raises is kept in the Explanation (`error`), whose routes show where it came
    from; KeyboardInterrupt and other BaseExceptions propagate."""
    import torchtpu

    result, error = None, None
    _C.explain_start()
    try:
        result = fn(*args, **kwargs)
        torchtpu.sync(wait=True)
    except Exception as raised:  # noqa: BLE001 - explaining a failure is the point
        error = raised
    finally:
        routes = [Route(*r) for r in _C.explain_stop()]
    return Explanation(routes, result, error)
