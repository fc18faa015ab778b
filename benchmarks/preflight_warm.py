"""A warm preflight of real PyTorch 2.6 (Debian's de-vendored source) in a fresh build tree, against
a cold one. Four preflights with one cache root: cold (empty ccache, no saved CMake checks, no saved
code generation), then three with --clean: one after removing the saved CMake checks and ATen's
saved code generation (the warm preflight before either was reused), one after removing the code
generation only (the checks seeded), and one that starts from both. Prints the warm/cold ratios
(goal <= 0.25 with the checks reused, <= 0.15 with the code generation reused too) and where the
warm preflight's time goes: its c10 target split into ATen's code
generation (ninja brings build.ninja's inputs up to date first) and the compiles, and its
configure as CMake's own profile of the same configure (--profiling-output, seeded the same way)
splits it: torchgen dry runs, probes, compiler identification, other commands, the scripts, the
generate step.

Usage: python benchmarks/preflight_warm.py [--base torchbuild/base:trixie-x86_64] [--dsc X.dsc]
       [--set k=v ...] [--no-breakdown]
Needs a Docker engine and the local base image (`invoke base-image --suite trixie`); run it on a
quiet machine (it prints the load average before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from debian_source import DSC_NAME, fetch_debian_pytorch  # noqa: E402
from preflight_ccache import invoke, manifest  # noqa: E402  (this directory is sys.path[0] when run as a script)

from torchbuild.builder.cmakecache import CheckCache  # noqa: E402
from torchbuild.profile.config import resolve  # noqa: E402
from torchbuild.runtime.engine import Engine  # noqa: E402

PROFILE = str(ROOT / "tests" / "fixtures" / "profiles" / "debian-pytorch-2.6.yaml")
CHECKS = re.compile(r"torchbuild: CMake checks: (.*probes ran)")
CODEGEN = re.compile(r"aten/src/ATen/\w*generated_(headers|sources|declarations_yaml)\.cmake$")


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def ninja_split(tree: Path) -> tuple[float, float]:
    """(seconds ATen's code generation took, seconds of the rest) of the tree's .ninja_log (one
    ninja run: a fresh tree), as wall-clock spans."""
    edges: dict[tuple[int, int], list[str]] = {}
    for line in (tree / "build" / ".ninja_log").read_text().splitlines()[1:]:
        start, end, _, output, _ = line.split("\t")
        edges.setdefault((int(start), int(end)), []).append(output)
    gen = [span for span, outs in edges.items() if any(CODEGEN.search(o) for o in outs)]
    rest = [span for span in edges if span not in gen]

    def wall(spans: list[tuple[int, int]]) -> float:
        return (max(e for _, e in spans) - min(s for s, _ in spans)) / 1000 if spans else 0.0

    return wall(gen), wall(rest)


# the commands whose time is one kind of work, counted where no enclosing one is
KINDS = {
    "try_compile": "probes (try_compile, try_run)",
    "try_run": "probes (try_compile, try_run)",
    "cmake_determine_compiler_id": "compiler identification",
    "cmake_determine_compiler_abi": "compiler identification",
    "execute_process": "other commands (execute_process)",
}


def trace_breakdown(trace: Path) -> dict[str, float]:
    """CMake's google-trace profile, as seconds per kind of work."""
    stack: list[dict] = []
    out: Counter[str] = Counter()
    for ev in json.loads(trace.read_text()):
        if ev["ph"] == "B":
            stack.append(ev)
            continue
        begin = stack.pop()
        seconds = (ev["ts"] - begin["ts"]) / 1e6
        name = begin["name"]
        if not stack:
            out[name] += seconds  # configure, generate
        elif name in KINDS and not any(s["name"] in KINDS for s in stack):
            args = begin.get("args", {}).get("functionArgs", "")
            out["torchgen dry runs" if "--dry-run" in args else KINDS[name]] += seconds
    out["CMake scripts (the rest)"] = out["configure"] - sum(
        v for k, v in out.items() if k not in ("configure", "generate")
    )
    return dict(out)


def profiled_configure(engine: Engine, image: str, tree: Path, cache: Path, log: str) -> dict[str, float]:
    """The warm preflight's CMake command again, in a scratch build tree seeded as the preflight
    seeds one, with CMake's profiler on."""
    env = {}
    lines = log.splitlines()
    start = lines.index("environment:") + 1
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        key, _, value = shlex.split(line.strip())[0].partition("=")
        env[key] = value
    cmake = next(ln for ln in lines if ln.startswith("cmake -GNinja "))
    scratch = tree / "build-profile"
    shutil.rmtree(scratch, ignore_errors=True)
    path = max((cache / "cmake-checks").glob("*.json"), key=lambda p: p.stat().st_mtime)
    data = json.loads(path.read_text())
    saved = CheckCache(path.parent, data["key"], data["image"]).load()
    assert saved is not None, path
    scratch.mkdir()
    (scratch / "CMakeCache.txt").write_text(saved.cache_text(path, setup_py=True))
    trace = "--profiling-output=/src/build-profile/trace.json"
    args = [*shlex.split(cmake)[:-1], "--profiling-format=google-trace", trace, "/src"]
    try:
        engine.client.containers.run(
            image,
            ["bash", "-c", f"cd /src/build-profile && {shlex.join(args)} > cmake.out 2>&1"],
            environment=env,
            volumes={str(tree): {"bind": "/src", "mode": "rw"}, str(cache): {"bind": "/cache", "mode": "rw"}},
            user=f"{os.getuid()}:{os.getgid()}",
            remove=True,
        )
        return trace_breakdown(scratch / "trace.json")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="torchbuild/base:trixie-x86_64")
    ap.add_argument("--dsc", type=Path, help=f"a local {DSC_NAME} (its tarballs beside it); default: apt-get source")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the profiled configure")
    args = ap.parse_args()
    engine = Engine.connect()
    with tempfile.TemporaryDirectory(prefix="tb-bench-") as tmp:
        work = Path(tmp)
        if args.dsc:
            (work / "debian-src").mkdir()
            for f in args.dsc.parent.glob("pytorch_2.6.0+dfsg*"):
                shutil.copy(f, work / "debian-src")
            dsc = work / "debian-src" / args.dsc.name
        else:
            dsc = fetch_debian_pytorch(engine, args.base, work / "debian-src")
        cache = work / "cache"
        overrides = [f"base_image={args.base}", f"cache_dir={cache}", *args.sets]
        sets = [a for s in overrides for a in ("--set", s)]
        invoke("image", "--profile", PROFILE, *sets)
        common = ["build", "--in-container", "--preflight", "--profile", PROFILE, "--source", str(dsc)]
        common += ["--out", str(work / "out"), "--progress", "raw", *sets]
        print(f"load average before: {load()}", flush=True)
        runs = {}
        runs["cold"] = invoke(*common)
        shutil.rmtree(cache / "cmake-checks")
        _drop_codegen(cache)
        runs["before"] = invoke(*common, "--clean")
        _drop_codegen(cache)
        runs["checks"] = invoke(*common, "--clean")
        runs["after"] = invoke(*common, "--clean")
        print(f"load average after:  {load()}", flush=True)
        report(runs, Path(manifest(runs["after"][1])["source"]["path"]))
        if not args.no_breakdown:
            log = (work / "out" / "logs" / manifest(runs["after"][1])["log"]).read_text()
            image = resolve(PROFILE, overrides).image_tag
            b = profiled_configure(engine, image, Path(manifest(runs["after"][1])["source"]["path"]), cache, log)
            parts = ", ".join(f"{k} {v:.1f} s" for k, v in b.items() if k not in ("configure", "generate"))
            print(f"seeded configure, CMake's profile: configure {b['configure']:.1f} s ({parts}),")
            print(f"                                   generate {b.get('generate', 0.0):.1f} s")


LABELS = {
    "cold": "cold (empty ccache, no saved checks)",
    "before": "warm, fresh tree, checks not reused",
    "checks": "warm, fresh tree, checks seeded",
    "after": "warm, checks seeded, codegen reused",
}


def _drop_codegen(cache: Path) -> None:
    """Remove ATen's saved code generation (<cache>/codegen/<key>), keeping the wrapper (bin/)."""
    for entry in (cache / "codegen").glob("*"):
        if entry.name != "bin":
            shutil.rmtree(entry)


def codegen_line(out: str) -> str:
    """How many of the torchgen runs were reused and how many ran (and were saved)."""
    return f"{out.count('code generation reused')} runs reused, {out.count('code generation saved')} ran"


def report(runs: dict[str, tuple[float, str]], tree: Path) -> None:
    for k, (seconds, out) in runs.items():
        m, checks = manifest(out)["preflight"], CHECKS.search(out)
        print(
            f"{LABELS[k]:40s} {seconds:6.1f} s  (configure {m['configure_s']} s"
            f"{': ' + checks[1] if checks else ''}; c10 {m['targets_s']} s; codegen {codegen_line(out)})"
        )
    cold = runs["cold"][0]
    print(f"ratio warm/cold before reuse:            {runs['before'][0] / cold:.2f}")
    print(f"ratio warm/cold with the checks seeded:  {runs['checks'][0] / cold:.2f}  (goal <= 0.25)")
    print(f"ratio warm/cold with codegen reused too: {runs['after'][0] / cold:.2f}  (goal <= 0.15)")
    codegen, rest = ninja_split(tree)
    print(
        f"warm c10 target (codegen reused): ATen code generation {codegen:.1f} s, then the compiles and link {rest:.1f} s"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
