"""The main job for real: Debian trixie's PyTorch 2.6.0+dfsg source built into a wheel by
`invoke build --in-container` with the debian-pytorch-2.6 test profile, at the lowest priority,
in a work directory outside the repository. Hours on 2 cores: run the same command again after
any cut (a stop, a reboot, Ctrl-C) and the build resumes where it stopped.

  python benchmarks/real_wheel.py build   [--work DIR]   # make or resume the wheel (nice -n 19)
  python benchmarks/real_wheel.py audit   [--work DIR]   # the build's own records after cuts
  python benchmarks/real_wheel.py rebuild [--work DIR]   # a fresh tree at another path, warm cache
  python benchmarks/real_wheel.py downstream [--work DIR] # verify, torchvision, install, module load

`build` prepares what it needs on the first run (a debootstrapped trixie base, the .dsc through
apt-get source, the toolchain image) and prints, once the wheel is there, the figures from its
manifest: wall and CPU time, compile units, peak memory, the lower bound and wall / bound.
`audit` reads the tree's .ninja_log (every output each ninja run finished) and ccache's
counters: an output listed twice was compiled twice; a unit in flight at a cut is never listed
(ninja logs an edge when it finishes), so a clean resume lists each output once. `rebuild`
builds the same source again in a fresh tree at another path with the warm ccache and the saved
code generation, and prints rebuild / cold and `invoke manifest.diff` of the two wheels. `downstream` takes the wheel on: `invoke verify`
(PyTorch's own tests included, the profile's verify_tests), `invoke companions` builds
torchvision 0.21 (Debian's orig tarball, upstream's release archive) against it, `invoke
install` puts both in a prefix with its modulefile, and a real Lmod `module load` of it imports
both and runs torchvision's nms; the manifest, the verify report and the report's summary go
to benchmarks/results/debian-pytorch-2.6/ with the commit they were made from.
Disk: the work directory holds the tree (about 4 GB built), ccache (about 2 GB) and the wheels.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "tests" / "fixtures" / "profiles" / "debian-pytorch-2.6.yaml"
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "fixtures")]


def invoke(*args: str, log: Path | None = None) -> int:
    cmd = ["nice", "-n", "19", sys.executable, "-m", "invoke", *args]
    if log is None:
        return subprocess.run(cmd, cwd=ROOT, check=False).returncode
    with log.open("a") as f:
        return subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=False).returncode


def site_sets(work: Path, cache: str = "cache") -> list[str]:
    certs = sorted(str(p) for p in Path("/usr/local/share/ca-certificates").glob("*.crt"))
    sets = [f"cache_dir={work / cache}"]
    if certs:
        sets.append("ca_certificates=" + ",".join(certs))
    return [a for s in sets for a in ("--set", s)]


def prepare(work: Path) -> Path:
    """The trixie base, the .dsc and the toolchain image (each made once)."""
    from debian_source import fetch_debian_pytorch

    from torchbuild.core.arch import Arch
    from torchbuild.image.baseimage import make_base_image
    from torchbuild.runtime.engine import Engine

    engine = Engine.connect()
    tag, _ = make_base_image(
        engine, suite="trixie", arch=Arch.X86_64, work_dir=work / "rootfs", ignore_valid_until=True
    )
    dsc = fetch_debian_pytorch(engine, tag, work / "src")
    if invoke("image", "--profile", str(PROFILE), *site_sets(work), log=work / "image.log") != 0:
        sys.exit(f"invoke image failed: {work / 'image.log'}")
    return dsc


def backfill_runs(work: Path, out: str = "out") -> None:
    """A tree a torchbuild started before it recorded its runs (build/torchbuild-runs.json): the
    record made once from the runs' logs, each named by its start and each a run that was cut (it
    stopped at its log's last write or its ninja's last step, whichever came later), at the path
    the in-container build sees them (/out/logs), so that the run that makes the wheel can give
    the whole build's wall over its bound. Nothing is written where the record exists."""
    from torchbuild.builder.runs import RUNS_FILE, RunRecord, write_runs

    for tree in sorted((work / "cache" / "src").glob("pytorch_*")):
        build_dir = tree / "build"
        if not (build_dir / ".ninja_log").is_file() or (build_dir / RUNS_FILE).exists():
            continue
        records = []
        for log in sorted((work / out / "logs").glob("build-*.log")):
            stamp = "-".join(log.stem.split("-")[-3:-1])
            with contextlib.suppress(ValueError):
                start = datetime.strptime(stamp, "%Y%m%d-%H%M%S").replace(tzinfo=timezone.utc).timestamp()
                records.append(RunRecord(log.stem.split("-")[-1], start, None, f"/out/logs/{log.name}"))
        write_runs(build_dir, records)
        print(f"{build_dir / RUNS_FILE}: {len(records)} earlier runs recorded from their logs", flush=True)


def build(work: Path, out: str = "out", cache: str = "cache", source: Path | None = None) -> int:
    dsc = prepare(work)
    backfill_runs(work, out)
    logs = sorted(work.glob(f"{out}-run-*.log"))
    log = work / f"{out}-run-{len(logs) + 1}.log"
    print(f"building (nice -n 19), log {log}", flush=True)
    args = ["build", "--in-container", "--resume", "--progress", "lines", "--profile", str(PROFILE)]
    args += ["--source", str(source or dsc), "--out", str(work / out), *site_sets(work, cache)]
    code = invoke(*args, log=log)
    if code == 0:
        figures(work / out)
    return code


def figures(out: Path) -> None:
    (manifest,) = sorted(out.glob("torch-*.whl.manifest.json"))[-1:]
    m = json.loads(manifest.read_text())
    eff = (m.get("report") or {}).get("efficiency") or {}
    heavy = (m.get("report") or {}).get("heaviest") or []
    print(f"wheel {m['wheel']['name']} ({m['wheel']['size'] / 1e6:.0f} MB)")
    print(
        f"wall {m['duration_s']:.0f} s in the last run; ccache {m['ccache']['hits']} hits, {m['ccache']['misses']} misses"
    )
    if eff:
        print(
            f"lower bound {eff['bound_s']:.0f} s on {eff['jobs']} jobs ({eff['limited_by']}); "
            f"wall / bound {eff['build_wall_s'] / eff['bound_s']:.2f} (goal <= 1.10) over {eff.get('runs', 1)} run(s); "
            f"ninja / bound {eff['ninja_wall_s'] / eff['bound_s']:.2f}"
        )
    if heavy:
        print(f"highest peak: {heavy[0]['file']} {heavy[0]['peak_rss_bytes'] / 2**30:.2f} GiB")


def audit(work: Path) -> None:
    trees = sorted((work / "cache" / "src").glob("pytorch_*"))
    if not trees:
        sys.exit(f"no tree under {work / 'cache' / 'src'}: run `build` first")
    build_dir = trees[0] / "build"
    log = build_dir / ".ninja_log"
    from torchbuild.builder.runs import read_runs
    from torchbuild.runtime.report import outputs_of

    outputs = outputs_of(log)
    twice = sorted(o for o, n in Counter(outputs).items() if n > 1)
    compiled_twice = [o for o in twice if o.endswith((".o", ".obj"))]
    objects = {o for o in outputs if o.endswith((".o", ".obj"))}
    runs = read_runs(build_dir)  # the tree's own record of the runs (builder/runs.py)
    print(f"{log}: {len(objects)} objects among {len(set(outputs))} outputs, over the build's {len(runs)} runs")
    print(
        f"objects compiled more than once: {len(compiled_twice)}"
        + (f" ({', '.join(compiled_twice[:5])})" if compiled_twice else "")
    )
    units = build_dir / "torchbuild-units.tsv"
    if units.is_file():
        names = [ln.split("\t")[2] for ln in units.read_text().splitlines() if ln.count("\t") == 3]
        again = [n for n, c in Counter(names).items() if c > 1]
        print(f"units measured through ccache's prefix: {len(names)}, compiled more than once: {len(again)}")
    env = {**os.environ, "CCACHE_DIR": str(work / "cache" / "ccache")}
    stats = subprocess.run(["ccache", "--print-stats"], env=env, capture_output=True, text=True, check=False).stdout
    counts = dict(line.split("\t", 1) for line in stats.splitlines() if "\t" in line)
    print(  # each torchbuild run zeroes them first: they are the last run's in this cache, not the build's
        f"ccache's counters, of the last run in this cache: {counts.get('direct_cache_hit', '?')} direct hits, "
        f"{counts.get('preprocessed_cache_hit', '?')} preprocessed hits, {counts.get('cache_miss', '?')} misses"
    )


def cold_wall(out: Path) -> float:
    """The cold build's wall time over all its runs: a cut build's manifest has its last run's
    duration only. Each run's log is named by its start (build-<profile>-YYYYmmdd-HHMMSS-<id>.log)
    and was last written at its end."""
    total = 0.0
    for log in sorted((out / "logs").glob("build-*.log")):
        stamp = "-".join(log.stem.split("-")[-3:-1])
        with contextlib.suppress(ValueError):
            start = datetime.strptime(stamp, "%Y%m%d-%H%M%S").replace(tzinfo=timezone.utc).timestamp()
            total += max(0.0, log.stat().st_mtime - start)
    return total or 1.0


def rebuild(work: Path) -> None:
    cold = json.loads(sorted((work / "out").glob("torch-*.whl.manifest.json"))[-1].read_text())
    t0 = time.monotonic()
    other = work / "elsewhere" / "deeper" / "pytorch"
    if not other.is_dir():  # the same .dsc unpacked afresh at another path (dpkg-source applies Debian's series)
        other.parent.mkdir(parents=True, exist_ok=True)
        dsc = sorted((work / "src").glob("*.dsc"))[0]
        subprocess.run(["dpkg-source", "-x", "--", str(dsc), str(other)], check=True, capture_output=True)
    code = build(work, out="out-rebuild", source=other)
    if code != 0:
        sys.exit(f"the rebuild failed ({code})")
    warm = json.loads(sorted((work / "out-rebuild").glob("torch-*.whl.manifest.json"))[-1].read_text())
    cold_s = cold_wall(work / "out")
    print(
        f"rebuild / cold: {warm['duration_s'] / cold_s:.3f} (goal <= 0.10): {warm['duration_s']:.0f} s against "
        f"{cold_s:.0f} s over the cold build's runs ({time.monotonic() - t0:.0f} s with the image check and verify)"
    )
    a = work / "out" / cold["wheel"]["name"]
    b = work / "out-rebuild" / warm["wheel"]["name"]
    print(f"byte-identical: {'yes' if cold['wheel']['sha256'] == warm['wheel']['sha256'] else 'no'}")
    invoke("manifest.diff", str(a) + ".manifest.json", str(b) + ".manifest.json")


VISION = (
    "http://deb.debian.org/debian/pool/main/p/pytorch-vision/pytorch-vision_0.21.0.orig.tar.gz",
    "0a4a967bbb7f9810f792cd0289a07fb98c8fb5d1303fae8b63e3a6b05d720058",
)
NMS = (
    "import torch, torchvision; from torchvision.ops import nms; "
    "b = torch.tensor([[0., 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]]); "
    "print('imported', torch.__version__, torchvision.__version__, torch.__file__); "
    "print('nms', nms(b, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist())"
)
RESULTS = ROOT / "benchmarks" / "results" / "debian-pytorch-2.6"


def timed(what: str, *args: str, log: Path) -> float:
    t0 = time.monotonic()
    code = invoke(*args, log=log)
    seconds = time.monotonic() - t0
    print(f"{what}: exit {code} in {seconds:.0f} s (log {log})", flush=True)
    if code != 0:
        sys.exit(f"{what} failed: {log}")
    return seconds


def downstream(work: Path) -> None:
    out = work / "out"
    (wheel,) = sorted(out.glob("torch-*.whl"))[-1:]
    base = ["--in-container", "--profile", str(PROFILE), *site_sets(work)]
    done = Path(f"{wheel}.verify.json")
    if not done.is_file() or not json.loads(done.read_text()).get("ok"):  # the build's verify, unless it failed
        timed("verify", "verify", *base, "--wheel", str(wheel), log=work / "verify.log")
    report = json.loads(Path(f"{wheel}.verify.json").read_text())
    print(f"verify ok: {report.get('ok')}; PyTorch's own tests: {json.dumps(report.get('tests', {}))[:400]}")
    vision = ["companions=[torchvision]", f'companion_repos={{"torchvision": "{VISION[0]}"}}']
    vision.append(f'companion_sha256={{"torchvision": "{VISION[1]}"}}')
    sets = [a for v in vision for a in ("--set", v)]
    seconds = timed("companions", "companions", *base, *sets, "--wheel", str(wheel), log=work / "companions.log")
    (tv,) = sorted(out.glob("torchvision-*.whl"))[-1:]
    tvm = json.loads(Path(f"{tv}.manifest.json").read_text())
    print(
        f"torchvision {tv.name}: {seconds:.0f} s, ccache {tvm['ccache']['hits']} hits, {tvm['ccache']['misses']} misses"
    )
    prefix = work / "prefix"
    force = ["--force"] if prefix.exists() else []
    timed("install", "install", *base, *force, "--prefix", str(prefix), "--wheel", str(wheel), "--wheel", str(tv),
          log=work / "install.log")  # fmt: skip
    module_load(work, prefix)
    keep_results(out, wheel, tv)


def module_load(work: Path, prefix: Path) -> None:
    """A real Lmod in the toolchain image (an image layer on top): `module load` of the prefix's
    modulefile, then torch and torchvision imported and nms run."""
    from torchbuild.profile.config import resolve

    spec = resolve(str(PROFILE))
    tag = "torchbuild-bench/real-wheel-lmod:latest"
    dockerfile = f"FROM {spec.image_tag}\nUSER 0\nRUN apt-get update -qq && apt-get install -y -qq lmod >/dev/null\n"
    subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=dockerfile, text=True, check=True)
    (name,) = [p.relative_to(prefix / "modulefiles") for p in (prefix / "modulefiles").rglob("*.lua")][:1]
    module = str(name.with_suffix(""))
    q = shlex.quote
    script = (
        f"source /usr/share/lmod/lmod/init/bash && module use {q(str(prefix / 'modulefiles'))} "
        f"&& module load {q(module)} && module list 2>&1 && cd /tmp && python -c {q(NMS)}"
    )
    res = subprocess.run(
        ["docker", "run", "--rm", "-v", f"{prefix}:{prefix}:ro", tag, "bash", "-c", script],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    (work / "module-load.log").write_text(res.stdout + res.stderr)
    print(f"module load {module}: exit {res.returncode}")
    print("\n".join(ln for ln in res.stdout.splitlines() if ln.startswith(("imported", "nms"))))
    if res.returncode != 0:
        sys.exit(f"module load failed: {work / 'module-load.log'}")


def keep_results(out: Path, wheel: Path, tv: Path) -> None:
    """The wheel's manifest, its verify report and its report's summary (not the wheels), with the
    commit they were made from."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    m = json.loads(Path(f"{wheel}.manifest.json").read_text())
    copies = [Path(f"{wheel}.manifest.json"), Path(f"{wheel}.verify.json"), Path(f"{tv}.manifest.json")]
    text = (m.get("report") or {}).get("text")
    if text:
        copies.append(out / "logs" / text)
    for path in copies:
        if path.is_file():
            (RESULTS / path.name).write_bytes(path.read_bytes())
    (RESULTS / "COMMIT").write_text(f"made by torchbuild at commit {commit.strip()}\n")
    print(f"results in {RESULTS}")


def floor(work: Path) -> None:
    """The wheel's ELF floor as auditwheel measures it (delivery/elffloor.analyse): what it needs of
    glibc and libstdc++, the libraries it needs from outside itself, the tag it earns or why not."""
    from torchbuild.runtime import elffloor

    (wheel,) = sorted((work / "out").glob("torch-*.whl"))
    start = time.monotonic()
    record = elffloor.analyse(wheel)
    outside = [lib.soname for lib in record.libraries if not lib.path and not lib.site]
    print(f"{wheel.name}: GLIBC_{record.glibc}, GLIBCXX_{record.glibcxx}, CXXABI_{record.cxxabi}")
    print(f"libraries needed: {len(record.libraries)}, found in no system path here or the wheel: {len(outside)}")
    print(f"tag: {record.tag or 'none'}; {record.reason}")
    print(f"measured with {record.auditwheel} in {time.monotonic() - start:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["build", "audit", "rebuild", "downstream", "floor"], nargs="?", default="build")
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "torchbuild-bench" / "real-wheel")
    args = ap.parse_args()
    work = args.work.absolute()
    work.mkdir(parents=True, exist_ok=True)
    if args.what == "build":
        sys.exit(build(work))
    if args.what == "audit":
        audit(work)
    elif args.what == "downstream":
        downstream(work)
    elif args.what == "floor":
        floor(work)
    else:
        rebuild(work)


if __name__ == "__main__":
    main()
