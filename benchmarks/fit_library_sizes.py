"""Where `memq fit`'s error on the library families comes from: the sizes the libraries choose at each shape.

Every rung of the ladder of the six families whose peak reserved `memq fit` missed by more than 5%
(lstm_lm, vit_ckpt, vit_bf16, gpt_compile from benchmarks/gpu/fit_families.py; vit_ckpt_bf16, gqa_lm from
fit_fresh.py) was recorded by hand (stacks="all") in its own process on one GPU
(benchmarks/gpu/fit_ladder_traces.sh; fixture tests/fixtures/fit_ladder). Per rung, this prints:

- `memq fit`: the base recording's prediction at the rung against the rung's real peak reserved (and allocated);
- own trace: the allocator model replaying the rung's own recorded program (is the model right?);
- sizes told: the base recording's program replayed with the sizes the rung really requested, for the
  requests the two programs share (aligned by their frames): what the prediction would be if the sizes the
  libraries chose at that shape were known;
- the requests whose real size is not the scaled one, named by the op that made them (the library's).

No services, no torch.

    python benchmarks/fit_library_sizes.py [--dir tests/fixtures/fit_ladder] [--only FAM] [--json]
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq.analysis import fit  # noqa: E402
from memq.analysis.allocator_model import OP_ALLOC  # noqa: E402
from memq.load import load_snapshot_file  # noqa: E402
from memq.model import frame_file, frame_line, frame_name  # noqa: E402

DEFAULT_DIR = ROOT / "tests" / "fixtures" / "fit_ladder"
# family: (base batch, base size, a sequence family: its length rungs too), as the capture scripts define them
FAMILIES = {"lstm_lm": (16, 128, True), "vit_ckpt": (16, 224, False), "vit_bf16": (8, 224, False),
            "gpt_compile": (8, 256, True), "vit_ckpt_bf16": (32, 224, False), "gqa_lm": (8, 256, True)}
# inductor names its generated modules by a hash of their code, which differs per shape: one name for all
_GENERATED = re.compile(r"c[a-z0-9]{40,}\.py")
_NAMED_OP = re.compile(r"^at::native::|Backward|cudnn|cublas", re.IGNORECASE)


def rungs(fam: str) -> list[tuple[str, float, float]]:
    """(tag, k, the length's part of k) of every rung above the base, as the capture names them."""
    b0, s0, seq = FAMILIES[fam]
    out = [(f"{fam}-b{b0 * k}-s{s0}", float(k), 1.0) for k in (2, 4, 8)]
    if seq:
        out += [(f"{fam}-b{b0}-s{s0 * k}", float(k), float(k)) for k in (2, 4)]
    return out


def base_tag(fam: str) -> str:
    b0, s0, _seq = FAMILIES[fam]
    return f"{fam}-b{b0}-s{s0}"


def _frames_key(frames) -> tuple:
    """Up to three frames that say which op made a request: Python files with their lines (a generated
    module as one name) and the named C++ ops."""
    parts: list[str] = []
    for f in frames or ():
        path = frame_file(f)
        if path.endswith(".py"):
            name = path.replace("\\", "/").rsplit("/", 1)[-1]
            parts.append("<generated>" if _GENERATED.fullmatch(name) else f"{name}:{frame_line(f)}")
        elif _NAMED_OP.search(frame_name(f)):
            parts.append(frame_name(f).split("(")[0])
        if len(parts) == 3:
            break
    return tuple(parts)


def _op_name(frames) -> str:
    """The op a request came from, as a reader names it: the first named C++ op, else the generated module's."""
    key = _frames_key(frames)
    for part in key:
        if part.startswith("at::native::") and not part.startswith("at::native::empty"):
            return part.removeprefix("at::native::")
    if "<generated>" in key:
        return "torch.compile's generated code"
    return next((p for p in key if p.endswith(tuple("0123456789"))), key[0] if key else "(no frames)")


class Recording:
    def __init__(self, path: Path):
        self.snap = load_snapshot_file(str(path), max_bytes=1 << 32).snapshot
        self.m = fit.classify(self.snap)
        prog = self.m.replay.program
        self.keys = [(op, _frames_key(self.snap.trace[self.m.replay.op_event[i]].frames))
                     for i, op in enumerate(prog.ops)]

    def frames(self, i: int):
        return self.snap.trace[self.m.replay.op_event[i]].frames


def aligned_allocs(base: Recording, rung: Recording) -> list[tuple[int, int]]:
    """(base op, rung op) of the requests the two programs share, matched in order by their frames."""
    sm = difflib.SequenceMatcher(a=base.keys, b=rung.keys, autojunk=False)
    out = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out += [(a, b) for a, b in zip(range(i1, i2), range(j1, j2), strict=True)
                    if base.m.replay.program.ops[a] == OP_ALLOC]
    return out


def rung_row(d: Path, base: Recording, tag: str, k: float, seq_k: float) -> dict:
    real = json.loads((d / "results" / f"{tag}.json").read_text())
    rung = Recording(d / "hand" / f"{tag}.pickle.gz")
    pred = fit.predict(base.m, k, None, seq_k)
    scaled = fit.scaled_sizes(base.m, k, seq_k=seq_k)
    told = list(scaled)
    chose: dict[str, list] = defaultdict(lambda: [0, 0, 0])  # op -> [requests, scaled bytes, real bytes]
    rung_sizes = rung.m.replay.program.size
    pairs = aligned_allocs(base, rung)  # a matching of two programs of thousands of requests: once
    for a, b in pairs:
        if scaled[a] != rung_sizes[b]:
            told[a] = rung_sizes[b]
            c = chose[_op_name(base.frames(a))]
            c[0] += 1
            c[1] += scaled[a]
            c[2] += rung_sizes[b]
    with_told = fit.predict(base.m, k, None, seq_k, sizes=told)
    own = fit.predict(rung.m, 1.0, sizes=fit.scaled_sizes(rung.m, 1.0))  # the model, not the recorded figure
    base_allocs = sum(1 for op in base.m.replay.program.ops if op == OP_ALLOC)
    rung_allocs = sum(1 for op in rung.m.replay.program.ops if op == OP_ALLOC)
    r, a = real["max_reserved"], real["max_allocated"]
    return {"rung": tag, "k": k, "seq_k": seq_k, "real_reserved": r, "real_allocated": a,
            "fit_error": (pred.peak_reserved - r) / r, "fit_allocated_error": (pred.peak_allocated - a) / a,
            "own_trace_error": (own.peak_reserved - r) / r, "told_error": (with_told.peak_reserved - r) / r,
            "requests": {"base": base_allocs, "rung": rung_allocs, "aligned": len(pairs)},
            "chosen": {op: {"requests": n, "scaled": s, "real": t} for op, (n, s, t) in
                       sorted(chose.items(), key=lambda kv: -abs(kv[1][2] - kv[1][1]))},
            "device": real.get("device")}


def family_rows(d: Path, fam: str) -> list[dict]:
    base = Recording(d / "hand" / f"{base_tag(fam)}.pickle.gz")
    return [rung_row(d, base, tag, k, seq_k) for tag, k, seq_k in rungs(fam)
            if (d / "hand" / f"{tag}.pickle.gz").is_file()]


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _chosen_words(row: dict, top: int = 2) -> str:
    words = []
    for op, c in list(row["chosen"].items())[:top]:
        if c["real"] == c["scaled"]:
            continue
        words.append(f"{op}: {c['requests']} x, scaled {c['scaled'] / c['requests'] / 2**20:.1f} MiB, "
                     f"real {c['real'] / c['requests'] / 2**20:.1f} MiB")
    return "; ".join(words) or "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=str(DEFAULT_DIR))
    ap.add_argument("--only", default="")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    d = Path(a.dir)
    fams = [f for f in FAMILIES if not a.only or f in a.only.split(",")]
    rows = {fam: family_rows(d, fam) for fam in fams}
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print("| rung | memq fit | (allocated) | model on the rung's own trace | sizes told | unaligned requests "
          "(base / rung) | what the libraries chose otherwise (per request) |")
    print("|---|---|---|---|---|---|---|")
    for rs in rows.values():
        for r in rs:
            q = r["requests"]
            print(f"| {r['rung']} | {_pct(r['fit_error'])} | {_pct(r['fit_allocated_error'])} | "
                  f"{_pct(r['own_trace_error'])} | {_pct(r['told_error'])} | {q['base'] - q['aligned']} / "
                  f"{q['rung'] - q['aligned']} | {_chosen_words(r)} |")
    allr = [r for rs in rows.values() for r in rs]
    out5 = [r for r in allr if abs(r["fit_error"]) > 0.05]
    told5 = [r for r in out5 if abs(r["told_error"]) <= 0.01]
    own = max(abs(r["own_trace_error"]) for r in allr)
    print(f"\n{len(allr)} rungs on {allr[0]['device'] if allr else '-'}: memq fit outside +/-5% on {len(out5)}; "
          f"of those, within 1% once the sizes the libraries chose are told: {len(told5)}; the model on each "
          f"rung's own trace: largest error {own * 100:.1f}%")


if __name__ == "__main__":
    main()
