"""The build report from ninja's `.ninja_log`: the slowest translation units and the time per
source directory, as text and as a PNG bar chart (drawn here: no plotting library needed in
the image or the SIF)."""

from __future__ import annotations

import dataclasses
import re
import struct
import zlib
from collections import defaultdict
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Step:
    output: str
    seconds: float


def read_ninja_log(path: Path) -> list[Step]:
    """The latest entry per output of a `.ninja_log` (v5 and later: start, end, mtime, output, hash)."""
    latest: dict[str, Step] = {}
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) < 4 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        latest[parts[3]] = Step(parts[3], (int(parts[1]) - int(parts[0])) / 1000)
    return list(latest.values())


def outputs_of(path: Path) -> list[str]:
    """Every output line of a `.ninja_log` in order (an output listed twice was built twice)."""
    return [ln.split("\t")[3] for ln in path.read_text(errors="replace").splitlines() if ln.count("\t") >= 3]


_OBJ_DIR = re.compile(r"(^|/)CMakeFiles/[^/]+\.dir/")


def source_dir(output: str) -> str:
    """caffe2/CMakeFiles/torch_cpu.dir/__/aten/src/ATen/native/Foo.cpp.o -> aten/src/ATen/native"""
    rel = _OBJ_DIR.sub("/", output).lstrip("/")
    parts: list[str] = []
    for part in rel.split("/")[:-1]:
        if part == "__":
            if parts:
                parts.pop()
        elif part:
            parts.append(part)
    return "/".join(parts) or "."


def is_compile(output: str) -> bool:
    return output.endswith((".o", ".obj"))


@dataclasses.dataclass(frozen=True)
class Report:
    steps: int
    compile_steps: int
    total_seconds: float
    slowest: list[Step]
    per_dir: list[tuple[str, float, int]]  # directory, seconds, units


def summarize(steps: list[Step], top: int = 15) -> Report:
    compiles = [s for s in steps if is_compile(s.output)]
    per: dict[str, list[float]] = defaultdict(list)
    for s in compiles:
        per[source_dir(s.output)].append(s.seconds)
    per_dir = sorted(((d, sum(v), len(v)) for d, v in per.items()), key=lambda x: -x[1])
    return Report(
        steps=len(steps),
        compile_steps=len(compiles),
        total_seconds=sum(s.seconds for s in steps),
        slowest=sorted(compiles, key=lambda s: -s.seconds)[:top],
        per_dir=per_dir[:top],
    )


def render_text(report: Report) -> str:
    lines = [
        f"ninja steps: {report.steps} ({report.compile_steps} compiles), "
        f"{report.total_seconds:.1f} s of compile time in total (summed over jobs)",
        "",
        "slowest translation units:",
    ]
    lines += [f"  {s.seconds:9.1f} s  {s.output}" for s in report.slowest]
    lines += ["", "time per source directory:"]
    lines += [f"  {secs:9.1f} s  {n:5d} units  {d}" for d, secs, n in report.per_dir]
    return "\n".join(lines) + "\n"


def write_report(ninja_log: Path, dest_stem: Path) -> tuple[Path, Path, Report]:
    """dest_stem.txt and dest_stem.png from ninja_log."""
    report = summarize(read_ninja_log(ninja_log))
    txt, png = dest_stem.with_suffix(".txt"), dest_stem.with_suffix(".png")
    txt.write_text(render_text(report))
    png.write_bytes(render_png(report))
    return txt, png, report


# --------------------------------------------------------------------------- PNG


# 3x5 glyphs, one string of 15 cells per character (rows top to bottom); lowercase is drawn
# as uppercase, anything missing as '?'.
_FONT = {
    "a": ".#.#.#####.##.#",
    "b": "##.#.###.#.###.",
    "c": ".###..#..#...##",
    "d": "##.#.##.##.###.",
    "e": "####..##.#..###",
    "f": "####..##.#..#..",
    "g": ".###..#.##.#.##",
    "h": "#.##.####.##.##",
    "i": "###.#..#..#.###",
    "j": "..#..#..##.#.#.",
    "k": "#.##.###.#.##.#",
    "l": "#..#..#..#..###",
    "m": "#.#####.##.##.#",
    "n": "##.#.##.##.##.#",
    "o": ".#.#.##.##.#.#.",
    "p": "##.#.###.#..#..",
    "q": ".#.#.##.##.#..#",
    "r": "##.#.###.#.##.#",
    "s": ".###...#...###.",
    "t": "###.#..#..#..#.",
    "u": "#.##.##.##.####",
    "v": "#.##.##.##.#.#.",
    "w": "#.##.##.######.",
    "x": "#.##.#.#.#.##.#",
    "y": "#.##.#.#..#..#.",
    "z": "###..#.#.#..###",
    "0": "####.##.##.####",
    "1": ".#.##..#..#.###",
    "2": "##...#.#.#..###",
    "3": "##...#.#...###.",
    "4": "#.##.####..#..#",
    "5": "####..##...###.",
    "6": ".#.#..##.##.#.#",
    "7": "###..#.#..#..#.",
    "8": ".#.#.#.#.#.#.#.",
    "9": ".#.#.#.##..#.#.",
    ".": ".............#.",
    ",": "..........#.#..",
    "_": "............###",
    "-": "......###......",
    "/": "..#..#.#.#..#..",
    ":": "....#.....#....",
    "%": "#.#..#.#.#..#.#",
    "(": ".#.#..#..#...#.",
    ")": ".#...#..#..#.#.",
    "+": "....#.###.#....",
    "=": "...###...###...",
    "[": "##.#..#..#..##.",
    "]": ".##..#..#..#.##",
    "<": "..#.#.#...#...#",
    ">": "#...#...#.#.#..",
    " ": "...............",
    "?": "##...#.#.....#.",
}
_SCALE = 2
_CHAR_W, _CHAR_H = 4 * _SCALE, 6 * _SCALE
_WHITE, _BLACK, _GREY = (255, 255, 255), (30, 30, 30), (200, 200, 200)
_BLUE, _ORANGE = (52, 101, 164), (206, 92, 0)


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.w, self.h = width, height
        self.px = [bytearray(_WHITE * width) for _ in range(height)]

    def rect(self, x: int, y: int, w: int, h: int, color: tuple[int, int, int]) -> None:
        for yy in range(max(0, y), min(self.h, y + h)):
            row = self.px[yy]
            x0, x1 = max(0, x), min(self.w, x + w)
            if x1 > x0:
                row[3 * x0 : 3 * x1] = bytes(color) * (x1 - x0)

    def text(self, x: int, y: int, s: str, color: tuple[int, int, int] = _BLACK) -> None:
        for i, ch in enumerate(s.lower()):
            glyph = _FONT.get(ch, _FONT["?"])
            for cell, on in enumerate(glyph):
                if on == "#":
                    cx, cy = cell % 3, cell // 3
                    self.rect(x + i * _CHAR_W + cx * _SCALE, y + cy * _SCALE, _SCALE, _SCALE, color)

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(row) for row in self.px)

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
        )


def _fit(label: str, chars: int) -> str:
    return label if len(label) <= chars else "..." + label[-(chars - 3) :]


def render_png(report: Report, width: int = 1000) -> bytes:
    """Two horizontal bar charts: the slowest translation units, then seconds per directory."""
    label_chars, row_h, pad = 48, _CHAR_H + 8, 12
    label_w = label_chars * _CHAR_W
    sections = [
        ("slowest translation units (s)", [(Path(s.output).name, s.seconds) for s in report.slowest], _BLUE),
        ("compile seconds per source directory", [(d, secs) for d, secs, _ in report.per_dir], _ORANGE),
    ]
    height = pad + sum(row_h * (len(rows) + 2) for _, rows, _ in sections) + pad
    canvas = _Canvas(width, height)
    y = pad
    bar_x = pad + label_w + pad
    bar_max = width - bar_x - pad - 10 * _CHAR_W
    for title, rows, color in sections:
        canvas.text(pad, y, title)
        y += row_h
        top = max((v for _, v in rows), default=0.0) or 1.0
        for label, value in rows:
            canvas.text(pad, y + 4, _fit(label, label_chars))
            w = max(1, int(bar_max * value / top))
            canvas.rect(bar_x, y + 2, w, row_h - 4, color)
            canvas.text(bar_x + w + 6, y + 4, f"{value:.1f}")
            y += row_h
        canvas.rect(pad, y + row_h // 2, width - 2 * pad, 1, _GREY)
        y += row_h
    return canvas.png()
