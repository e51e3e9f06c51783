"""transpose and concat on a real GPU: every variant validates exactly (outputs NaN-poisoned,
fresh inputs, misaligned views, random splits) on odd shapes in every dtype; the dispatcher's
calls and the torch ops match torch."""

from __future__ import annotations

import secrets
import pytest

from autogen.core.registry import get_family
from nvcc_tools import extreme_configs
from variant_cubins import compile_spaces

pytestmark = pytest.mark.gpu

DTYPES = ["float32", "float16", "bfloat16"]
TRANSPOSE_SHAPES = [(1, 1), (1, 37), (37, 1), (33, 65), (257, 129), (4099, 3001)]
CONCAT_SHAPES = [(1, 1, 1), (3, 7, 33), (9, 19, 23), (17, 40, 33), (4, 4099, 3001)]


class _SpacesByFamily(dict):
    """{(family, dtype): {kernel name: (config, cubin)}}: every variant of a family in every dtype,
    compiled in one pool when a test first asks for the family (so `-k transpose` builds no concat)."""

    def __missing__(self, key):
        self.update(compile_spaces((key[0],), DTYPES))
        return self[key]


@pytest.fixture(scope="module")
def cubins():
    return _SpacesByFamily()


def _validate(cubins, family_name, dtype, dims, configs=None):
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    evaluator = Evaluator(WorkSpec(family_name, dtype, tuple(dims.items())))
    failures = []
    for name, (config, cubin) in cubins[(family_name, dtype)].items():
        if configs is not None and config not in configs:
            continue
        assert isinstance(cubin, bytes), f"{name}: {str(cubin)[:300]}"
        check = evaluator.check(name, cubin, config.as_dict())
        if not check.ok:
            failures.append(f"{name}: {check.reason}")
    assert not failures, f"{len(failures)} {family_name} {dtype} variants failed on {dims}:\n" + "\n".join(failures[:10])


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_transpose_variant_validates_on_an_odd_shape(cubins, dtype):
    _validate(cubins, "transpose", dtype, {"rows": 67, "cols": 131})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", TRANSPOSE_SHAPES)
def test_transpose_extreme_variants_validate(cubins, dtype, rows, cols):
    _validate(cubins, "transpose", dtype, {"rows": rows, "cols": cols}, extreme_configs(get_family("transpose")))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", ["0", "1"])
def test_every_concat_variant_validates_on_an_odd_shape(cubins, dtype, axis):
    _validate(cubins, "concat", dtype, {"k": 10, "rows": 37, "cols": 41, "axis": axis})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", ["0", "1"])
@pytest.mark.parametrize("k, rows, cols", CONCAT_SHAPES)
def test_concat_extreme_variants_validate(cubins, dtype, axis, k, rows, cols):
    _validate(cubins, "concat", dtype, {"k": k, "rows": rows, "cols": cols, "axis": axis},
              extreme_configs(get_family("concat")))


def _rng():
    import cupy
    return cupy.random.default_rng(secrets.randbits(63))


def test_dispatched_transpose_and_concat_match_cupy():
    import cupy

    import autogen

    x = _rng().random((301, 47), dtype=cupy.float32)
    assert cupy.array_equal(autogen.transpose(x), x.T)
    out = cupy.full((47, 301), cupy.nan, dtype=cupy.float32)
    assert autogen.transpose(x, out=out) is out and cupy.array_equal(out, x.T)
    parts = [_rng().random((r, 13), dtype=cupy.float32).astype(cupy.float16) for r in (5, 0, 1, 30)]
    assert cupy.array_equal(autogen.concat(parts), cupy.concatenate(parts, axis=0))
    columns = [_rng().random((7, c), dtype=cupy.float32) for c in range(1, 12)]  # 11 inputs: two launches
    assert cupy.array_equal(autogen.concat(columns, axis=1), cupy.concatenate(columns, axis=1))
    from autogen.errors import ArgumentError

    with pytest.raises(ArgumentError, match="must agree on axis 1"):
        autogen.concat([x, cupy.zeros((3, 5), dtype=cupy.float32)], axis=0)


def test_torch_ops_match_torch_in_every_dtype():
    torch = pytest.importorskip("torch")
    from autogen.torch import ops  # noqa: F401  registers the ops

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(1025, 3001, device="cuda").to(dtype)
        assert torch.equal(torch.ops.autogen.transpose(x), x.t().contiguous())
        arrays = [torch.randn(1025, c, device="cuda").to(dtype) for c in (1, 300, 7, 2001)]
        assert torch.equal(torch.ops.autogen.concat(arrays, 1), torch.cat(arrays, dim=1))
        out = torch.empty(1025 * 2, 3001, device="cuda", dtype=dtype)
        torch.ops.autogen.concat_out([x, x], 0, out=out)
        assert torch.equal(out, torch.cat([x, x]))
