"""autogen.tune_kernel: Kernel Tuner's one call, run by autogen's search (autogen.search.tuner)
on the family autogen.core.kernel_family makes of the kernel. See docs/tune_kernel.md."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import NamedTuple

from tuning_db import TuningDB

from autogen._version import __version__
from autogen.core.kernel_family import check_picklable, kernel_family, save_data
from autogen.core.kernel_spec import problem_sizes
from autogen.errors import UsageError
from autogen.gpu.backend import GpuBackend
from autogen.search.tuner import Tuner, TuneOptions

# Kernel Tuner's strategies autogen has a counterpart of: its samplers.
STRATEGIES = {"brute_force": "exhaustive", "random_sample": "random", "bayes_opt": "tpe", "tpe": "tpe"}
# Kernel Tuner options taken and not needed here: autogen times with CUDA graphs and its own
# sample count (iterations), compiles CUDA through NVRTC (lang), reports through its progress lines.
IGNORED_OPTIONS = ("iterations", "verbose", "lang", "cache", "simulation_mode", "quiet")
DEFAULT_TRIALS = 60  # for the sampling strategies, as `autogen tune`


class TuneKernelResult(NamedTuple):
    """(results, env), as Kernel Tuner's tune_kernel returns them, plus `best`. results: one
    dict per variant measured (its parameters, `time` in ms as Kernel Tuner reports it,
    `time_us`, `status` ok/failed, `error`: the relative L2 error, `reason` where it failed,
    `kernel_name`); env: the device, software and run."""

    results: list
    env: dict

    @property
    def best(self) -> dict | None:
        """The stored winner's parameters (re-timed against the other finalists), else None."""
        return self.env.get("best_params")


def tune_kernel(kernel_name, kernel_source, problem_size, arguments, tune_params, grid_div_x=None, grid_div_y=None,
                grid_div_z=None, restrictions=None, answer=None, atol=1e-6, block_size_names=None,
                compiler_options=None, strategy="brute_force", strategy_options=None, *, name=None, jinja=False,
                tolerance=None, poison_outputs=True, db=None, cache_mode="cold", seed=0, progress=None,
                backend_factory=None, **kernel_tuner_options) -> TuneKernelResult:
    """Tune one CUDA kernel with Kernel Tuner's arguments; store the results in autogen's
    database under the family `kernel.<kernel_name>` (or `name`), where `autogen list`, `show`,
    `export`, autogen.lookup and autogen.call find them once the family is defined in that
    process (autogen.kernel_family with the same arguments, docs/tune_kernel.md).

    As Kernel Tuner: `problem_size` (an int or a tuple of up to 3), `arguments` (NumPy/CuPy
    arrays and NumPy scalars, in the kernel's order), `tune_params` ({name: [values]}, each
    defined before the source with the block sizes and `kernel_tuner`), the grid
    ceil(problem_size / product of grid_div_x|y|z), by default the block size parameters,
    `restrictions` (expressions or a callable on the parameter dict), `answer` (aligned with
    `arguments`, None for each non-output) and `atol`, `block_size_names`, `compiler_options`
    (given to NVRTC for every variant, and to nvcc in `autogen check` and the export's build:
    -DNAME[=VALUE], -use_fast_math, -lineinfo, -maxrregcount=N, -ftz/-prec-div/-prec-sqrt/-fmad=
    true|false, -extra-device-vectorization, -restrict, -std=c++NN; the target architecture and
    include paths are refused), `strategy` (brute_force, random_sample, bayes_opt) with
    strategy_options={"max_fevals": N}.

    Where autogen deliberately differs: each variant is timed with CUDA graphs on cold rotating
    copies of the arguments (several sets larger than 4x the L2 cache together; `cache_mode="hot"`
    for one), the median of its replays, the best few re-timed interleaved before the winner is
    named; outputs are poisoned with NaN (-1 for integers) before every check, and a variant
    passes when its relative L2 error against the answer (as float64) is within `tolerance`
    (default 1e-5 for float32 outputs, 1e-3 float16, exact for integers) and allclose(atol) holds
    too, rather than by atol alone; without an answer the outputs must only be written and finite.
    Parameter values are integers or identifiers; grid_size_x/y/z are not defined (one variant
    serves every size); problem sizes and divisors are not strings or callables of the problem."""
    unknown = sorted(set(kernel_tuner_options) - set(IGNORED_OPTIONS))
    if unknown:
        raise UsageError(f"tune_kernel does not take {', '.join(unknown)} (Kernel Tuner options autogen has no "
                         "counterpart of; see docs/tune_kernel.md)")
    if strategy not in STRATEGIES:
        raise UsageError(f"strategy {strategy!r} has no autogen counterpart; choose one of {', '.join(STRATEGIES)}")
    family = kernel_family(kernel_name, kernel_source, problem_size, arguments, tune_params, grid_div_x, grid_div_y,
                           grid_div_z, restrictions, answer, atol, block_size_names, compiler_options, name=name,
                           jinja=jinja, tolerance=tolerance, poison_outputs=poison_outputs)
    check_picklable(family)
    problem = family.problem(family.dtypes[0], **dict(zip(family.dims, problem_sizes(problem_size))))
    trials = _trials(strategy, strategy_options, family.space.size())
    options = TuneOptions(trials=trials, sampler=STRATEGIES[strategy], seed=seed, cache_mode=cache_mode, db_url=db)
    with tempfile.TemporaryDirectory(prefix="autogen-kernel-") as folder:
        save_data(family, Path(folder) / "arguments.npz")  # what the GPU worker validates with
        tuner = Tuner(problem, options, **({"progress": progress} if progress else {}),
                      backend_factory=backend_factory or GpuBackend)
        result = tuner.run()
    family.data_path = None
    return _collected(tuner, result)


def _trials(strategy: str, strategy_options, space_size: int) -> int:
    options = dict(strategy_options or {})
    unknown = sorted(set(options) - {"max_fevals"})
    if unknown:
        raise UsageError(f"strategy_options takes max_fevals only, not {', '.join(unknown)}")
    wanted = options.get("max_fevals")
    if wanted is not None and (isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1):
        raise UsageError(f"max_fevals must be an integer >= 1, got {wanted!r}")
    default = space_size if strategy == "brute_force" else min(DEFAULT_TRIALS, space_size)
    return min(wanted or default, space_size)


def _collected(tuner: Tuner, result) -> TuneKernelResult:
    problem, device = result.problem, result.device
    trials = TuningDB(tuner.options.db_url).trials(device, problem.family, problem.dtype, problem.shape_key,
                                                   tuner.options.cache_mode)
    results = [{**t.params, "time": t.time_us / 1000 if t.time_us is not None else None, "time_us": t.time_us,
                "status": t.status, "error": t.error, "reason": t.reason, "kernel_name": t.kernel_name}
               for t in trials if t.status != "rejected"]
    winner = result.winner
    env = {"device_name": device.name, "compute_capability": device.compute_capability,
           "driver_version": device.driver_version, "runtime_version": device.runtime_version,
           "nvrtc_version": device.nvrtc_version, "autogen_version": __version__, "family": problem.family,
           "problem": problem.shape_key, "db": result.db_url, "cache_mode": tuner.options.cache_mode,
           "sampler": tuner.options.sampler, "measured": result.measured, "failed": result.failed,
           "wall_s": round(result.wall_s, 3), "best_params": dict(winner.trial.params) if winner else None,
           "best_time_us": winner.trial.time_us if winner else None,
           "best_kernel": winner.trial.kernel_name if winner else None, "no_winner": result.no_winner}
    return TuneKernelResult(results, env)

