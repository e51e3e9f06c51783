"""`autogen tune-kernel FILE.cu ...` (autogen.tune_kernel from the command line) and `autogen
check FAMILY|FILE.cu` (every point rendered, a sample compiled with nvcc: no GPU). See
docs/tune_kernel.md."""

from __future__ import annotations

import concurrent.futures
import itertools
from pathlib import Path

from autogen.cli.options import int_list, strict_float, strict_int
from autogen.core.kernel_family import kernel_family
from autogen.core.kernel_spec import IDENTIFIER
from autogen.core.registry import get_family
from autogen.errors import AutogenError, UsageError
from autogen.gpu.resources import kernel_resources, nvcc_path
from autogen.report import to_json

STRATEGIES = ("brute_force", "random_sample", "bayes_opt")


def add_kernel_options(parser, tuning: bool) -> None:
    """The options that describe a kernel file (tune-kernel's, and check's for a .cu)."""
    kernel = parser.add_argument_group("the kernel (as Kernel Tuner's tune_kernel takes it)")
    kernel.add_argument("--kernel", metavar="NAME", help="the __global__ function to tune")
    kernel.add_argument("--param", action="append", default=[], metavar="NAME=V1,V2,...",
                        help="a tunable parameter and its values (integers or identifiers), #defined before the "
                             "source; give one --param per parameter")
    kernel.add_argument("--problem-size", metavar="N[,M[,K]]", type=lambda t: int_list(t, "--problem-size"),
                        required=tuning, help="the size the grid is computed from")
    kernel.add_argument("--args", metavar="RULE", help="how to make the kernel's arguments, one item per argument: "
                        "'out:float32[size_x] float32[size_x] float32[size_x] int32=size_x' (arrays random in "
                        "[0, 1), integers in [0, 100), out: arrays poisoned and checked written)")
    kernel.add_argument("--npz", type=Path, metavar="FILE", help="the arguments as arg0, arg1, ... (0-d arrays for "
                        "scalars) and, for outputs, their answers answer0, ... in a NumPy .npz")
    kernel.add_argument("--restrict", action="append", default=[], metavar="EXPR",
                        help="a restriction every point satisfies, e.g. 'block_size_x*block_size_y<=1024'")
    for axis in "xyz":
        kernel.add_argument(f"--grid-div-{axis}", metavar="EXPR,...",
                            help=f"what divides the {axis} size into blocks (default block_size_{axis} when tuned; "
                                 "'' for nothing)")
    kernel.add_argument("--block-size-names", metavar="X[,Y[,Z]]", help="the parameters that are the block's sizes")
    kernel.add_argument("--define", action="append", default=[], metavar="NAME[=VALUE]",
                        help="a macro every variant is compiled with (-DNAME[=VALUE])")
    kernel.add_argument("--compiler-option", action="append", default=[], metavar="OPTION",
                        help="an NVRTC option every variant is compiled with, as Kernel Tuner's compiler_options "
                             "(repeatable; write --compiler-option=-use_fast_math): -use_fast_math, -lineinfo, "
                             "-maxrregcount=N, -ftz=, -prec-div=, -prec-sqrt=, -fmad= (true|false), "
                             "-extra-device-vectorization, -restrict, -std=c++NN, -DNAME[=VALUE]")
    kernel.add_argument("--jinja", action="store_true", help="also render the source as a Jinja2 template")
    kernel.add_argument("--name", help="the family's name (default kernel.<NAME>)")


def add_commands(subcommands, add_db_arg) -> None:
    tune = subcommands.add_parser("tune-kernel", help="tune a plain CUDA kernel file as Kernel Tuner does")
    tune.add_argument("file", type=Path, metavar="FILE.cu")
    add_kernel_options(tune, True)
    tune.add_argument("--strategy", default="brute_force", choices=STRATEGIES,
                      help="brute_force (every point, default), random_sample, bayes_opt (autogen's TPE)")
    tune.add_argument("--max-fevals", type=lambda t: strict_int(t, "--max-fevals"), metavar="N",
                      help="variants to measure at most")
    tune.add_argument("--atol", type=lambda t: strict_float(t, "--atol"), default=1e-6)
    tune.add_argument("--tolerance", type=lambda t: strict_float(t, "--tolerance"),
                      help="relative L2 error allowed against the answer (default by output dtype)")
    tune.add_argument("--cache", default="cold", choices=["cold", "hot"])
    tune.add_argument("--seed", type=lambda t: strict_int(t, "--seed"), default=0)
    tune.add_argument("--json", action="store_true")
    add_db_arg(tune)

    check = subcommands.add_parser("check", help="render every point of a family (or a kernel file's --param grid) "
                                                 "and compile a sample with nvcc; no GPU needed")
    check.add_argument("target", metavar="FAMILY|FILE.cu")
    add_kernel_options(check, False)
    check.add_argument("--arch", default="sm_90", help="nvcc architecture (default sm_90)")
    check.add_argument("--sample", type=lambda t: strict_int(t, "--sample"), default=12, metavar="N",
                       help="points compiled at most, chosen to hold every parameter's every value (default 12)")
    check.add_argument("--json", action="store_true")


def _param(text: str) -> tuple[str, list]:
    name, sep, values = text.partition("=")
    if not sep or not IDENTIFIER.fullmatch(name.strip()) or not values.strip():
        raise UsageError(f"--param {text!r} is not NAME=V1,V2,...")
    return name.strip(), [int(v) if v.strip().lstrip("-").isdigit() else v.strip() for v in values.split(",")]


def _expressions(text: str | None):
    return None if text is None else [e.strip() for e in text.split(",") if e.strip()]


def _kernel_arguments(args, sizes: tuple[int, ...]):
    """(arguments, answer) for tune_kernel: from --npz, else --args's rule."""
    import numpy as np

    if args.npz is not None and args.args is not None:
        raise UsageError("give --args or --npz, not both")
    if args.npz is None:
        if args.args is None:
            raise UsageError("give the kernel's arguments: --args RULE or --npz FILE")
        return args.args, None
    try:
        with np.load(args.npz, allow_pickle=False) as stored:
            count = sum(1 for key in stored.files if key.startswith("arg"))
            if count == 0 or any(f"arg{i}" not in stored.files for i in range(count)):
                raise UsageError(f"{args.npz} must hold arg0, arg1, ... (one per kernel argument)")
            values = [stored[f"arg{i}"] for i in range(count)]
            values = [v if v.ndim else v[()] for v in values]
            answer = [stored[f"answer{i}"] if f"answer{i}" in stored.files else None for i in range(count)]
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {args.npz}: {exc}") from None
    return values, answer


def _kernel_definition(args, file: Path, sizes) -> dict:
    if not args.kernel:
        raise UsageError("--kernel NAME is required for a kernel file")
    if not args.param:
        raise UsageError("give at least one --param NAME=V1,V2,...")
    params = dict(_param(p) for p in args.param)
    if len(params) != len(args.param):
        raise UsageError("a --param is given twice")
    if not file.is_file():
        raise UsageError(f"kernel file {file} not found")
    names = None if args.block_size_names is None else [n.strip() for n in args.block_size_names.split(",")]
    return dict(kernel_name=args.kernel, kernel_source=file, problem_size=tuple(sizes), tune_params=params,
                grid_div_x=_expressions(args.grid_div_x), grid_div_y=_expressions(args.grid_div_y),
                grid_div_z=_expressions(args.grid_div_z), restrictions=args.restrict or None,
                block_size_names=names, jinja=args.jinja, name=args.name,
                compiler_options=[f"-D{d}" for d in args.define] + args.compiler_option)


def cmd_tune_kernel(args) -> int:
    from autogen.search.kernel_tune import tune_kernel

    definition = _kernel_definition(args, args.file, args.problem_size)
    arguments, answer = _kernel_arguments(args, args.problem_size)
    if args.max_fevals is not None and args.max_fevals < 1:
        raise UsageError(f"--max-fevals must be at least 1, got {args.max_fevals}")
    found = tune_kernel(arguments=arguments, answer=answer, atol=args.atol,
                        strategy=args.strategy,
                        strategy_options={"max_fevals": args.max_fevals} if args.max_fevals else None,
                        tolerance=args.tolerance, db=args.db, cache_mode=args.cache, seed=args.seed, **definition)
    env = found.env
    if args.json:
        print(to_json({"best": found.best, "env": env, "results": found.results}))
    elif found.best is None:
        print(f"{env['family']} {env['problem']}: no winner ({env['no_winner']})")
    else:
        ok = sum(1 for r in found.results if r["status"] == "ok")
        print(f"{env['family']} {env['problem']} on {env['device_name']}: best {env['best_kernel']} "
              f"{env['best_time_us']:.3f} us {found.best}")
        print(f"{len(found.results)} variants measured ({ok} passed), {env['wall_s']:.1f} s; stored in {env['db']}")
    return 0 if found.best is not None else 1


def _check_family(args):
    target = Path(args.target)
    if args.target.endswith(".cu") or target.is_file():
        sizes = args.problem_size or [1]
        definition = _kernel_definition(args, target, sizes)
        # Checking needs no data: a placeholder argument when none is described.
        arguments = args.args if args.args is not None else "float32=0"
        return kernel_family(arguments=arguments, **definition)
    return get_family(args.target)


def cmd_check(args) -> int:
    from autogen.core.render import render  # Jinja2: off the CLI's start

    family = _check_family(args)
    nvcc = nvcc_path()
    rendered, render_failures = [], []
    for dtype in family.dtypes:
        coded = [[(t.name, c) for c in t.choices] for t in family.traits if t.code]
        for traits in itertools.product(*coded):
            for config in family.space.enumerate():
                try:
                    rendered.append((dtype, traits, config, render(family, dtype, config, traits=traits)))
                except AutogenError as exc:
                    render_failures.append({"kernel": family.kernel_name(dtype, config, traits), "error": str(exc)})
    sample = _covering_sample(family, rendered, max(1, args.sample))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        compiled = list(pool.map(lambda item: _compiled(item, args.arch, nvcc, family), sample))
    compile_failures = [c for c in compiled if "error" in c]
    spills = [c for c in compiled if c.get("spill_store_bytes") or c.get("spill_load_bytes")]
    doc = {"family": family.name, "points": len(rendered) + len(render_failures), "render_failures": render_failures,
           "arch": args.arch, "compiled": compiled, "compile_failures": len(compile_failures), "spills": len(spills)}
    if args.json:
        print(to_json(doc))
    else:
        print(f"{family.name}: rendered {len(rendered)} of {doc['points']} points; compiled {len(compiled)} with nvcc "
              f"for {args.arch}: {len(compile_failures)} failed, {len(spills)} spill")
        for failure in render_failures:
            print(f"  render failed: {failure['kernel']}: {failure['error']}")
        for entry in compile_failures:
            print(f"  compile failed: {entry['kernel']}: {entry['error']}")
        for entry in spills:
            print(f"  spills: {entry['kernel']}: {entry['spill_store_bytes']} B stored, "
                  f"{entry['spill_load_bytes']} B loaded")
    return 1 if render_failures or compile_failures else 0


def _covering_sample(family, rendered: list, limit: int) -> list:
    """Rendered points, at most `limit`: first those that together hold every parameter's every
    value where `limit` allows (the first point holding a value not yet held is taken), then
    the others in order."""
    wanted = {(p.name, c) for p in family.space.params for c in p.choices}
    covering, others = [], []
    for item in rendered:
        held = set(item[2].params) & wanted
        (covering if held else others).append(item)
        wanted -= held
    return (covering + others)[:limit]


def _compiled(item, arch: str, nvcc: str, family) -> dict:
    dtype, traits, config, source = item
    name = family.kernel_name(dtype, config, traits)
    try:
        found = [r.as_dict() for r in kernel_resources(source, arch, nvcc, family.compiler_options)
                 if r.kernel.startswith(name)]
    except AutogenError as exc:
        return {"kernel": name, "error": " ".join(str(exc).split())[:400]}
    spill_store = sum(r["spill_store_bytes"] for r in found)
    spill_load = sum(r["spill_load_bytes"] for r in found)
    return {"kernel": name, "registers": max((r["registers"] for r in found), default=0),
            "spill_store_bytes": spill_store, "spill_load_bytes": spill_load}
