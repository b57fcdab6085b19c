"""A load's gains, block by block: speculation's latency gain and throughput gain over the plain block beside it at
the same load (the same requests, in the same order), for all the block's requests and per prompt kind.

- latency gain: the plain requests' median end-to-end latency over the speculative ones';
- throughput gain: the speculative block's output tokens/s (tokens over its wall time) over the plain block's; per
  kind, where a block mixes kinds, each kind's own stream: its tokens over its requests' summed latency (in a closed
  loop a client's throughput is its tokens over its latency; Little's law sums the clients).

Point and interval of a load's gain: the median of its blocks and the median's distribution-free interval
(``speclab.stats.intervals.median_ci``: none from fewer blocks than it needs).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from speclab.stats.intervals import median_ci, runs_needed

ALL = "all"
GAIN_COLUMNS = ["label", "arm", "k", "drafter", "load", "block", "kind", "latency_gain", "throughput_gain",
                "plain_latency_s", "latency_s", "plain_tokens_per_s", "tokens_per_s", "tpot_s", "plain_tpot_s",
                "ttft_s", "plain_ttft_s", "requests", "new_tokens", "passes", "drafted", "accepted"]


def _stream(rows: pd.DataFrame) -> float:
    return float(rows.new_tokens.sum() / rows.latency_s.sum()) if rows.latency_s.sum() > 0 else np.nan


def block_gains(requests: pd.DataFrame, kinds: bool = False) -> pd.DataFrame:
    """One row per speculative configuration, load, block (and kind: ``kinds``, else ``all``) with its gains.
    ``requests``: the load stage's request rows (label, arm, load, block, kind, latency_s, new_tokens, ...)."""
    out = []
    for (load, block), blk in requests.groupby(["load", "block"], sort=True):
        plain = blk[blk.arm == "plain"]
        if not len(plain):
            continue
        for label, spec in blk[blk.arm != "plain"].groupby("label", sort=False):
            groups = [(ALL, spec, plain)]
            if kinds:
                groups += [(str(kind), s, plain[plain.kind == kind]) for kind, s in spec.groupby("kind", sort=True)]
            for kind, s, p in groups:
                if not len(p) or not len(s):
                    continue
                whole = kind == ALL
                tps = float(s.block_tokens_per_s.iloc[0]) if whole else _stream(s)
                plain_tps = float(p.block_tokens_per_s.iloc[0]) if whole else _stream(p)
                first = s.iloc[0]
                out.append({"label": label, "arm": first.arm, "k": int(first.k), "drafter": first.drafter,
                            "load": int(load), "block": block, "kind": kind,
                            "latency_gain": float(p.latency_s.median() / s.latency_s.median()),
                            "throughput_gain": tps / plain_tps, "plain_latency_s": float(p.latency_s.median()),
                            "latency_s": float(s.latency_s.median()), "plain_tokens_per_s": plain_tps,
                            "tokens_per_s": tps, "tpot_s": float(s.tpot_s.median()),
                            "plain_tpot_s": float(p.tpot_s.median()), "ttft_s": float(s.ttft_s.median()),
                            "plain_ttft_s": float(p.ttft_s.median()), "requests": len(s),
                            "new_tokens": int(s.new_tokens.sum()),
                            "passes": int(s.passes.sum()), "drafted": int(s.drafted.sum()),
                            "accepted": int(s.accepted.sum())})
    return pd.DataFrame(out, columns=GAIN_COLUMNS)


def gain_interval(gains: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """The median of a load's block gains and its distribution-free interval (NaN: fewer blocks than it needs)."""
    gains = np.asarray(gains, dtype=float)
    gains = gains[~np.isnan(gains)]
    if not len(gains):
        return np.nan, np.nan, np.nan
    lo, hi = median_ci(gains, level) if len(gains) >= runs_needed(level) else (np.nan, np.nan)
    return float(np.median(gains)), float(lo), float(hi)


def speed_check(rows: pd.DataFrame) -> dict[str, float] | None:
    """The load generator's plain tokens/s at load 1 (each block's tokens over its wall time) over the speed stage's
    runs of the same requests right after it (their tokens over their summed wall times): the medians over blocks
    and the median of the blocks' ratios. ``rows``: one job's load rows (request and speed_run); None without a
    speed run."""
    speed = rows[rows.measure == "speed_run"]
    load = rows[(rows.measure == "request") & (rows.load == 1) & (rows.arm == "plain")]
    pairs = []
    for block, s in speed.groupby("block"):
        blk = load[load.block == block]
        if len(blk):
            pairs.append((float(blk.block_tokens_per_s.iloc[0]), float(s.new_tokens.sum() / s.latency_s.sum())))
    if not pairs:
        return None
    a = np.array(pairs)
    return {"speed_check_ratio": float(np.median(a[:, 0] / a[:, 1])), "load_tokens_per_s": float(np.median(a[:, 0])),
            "speed_tokens_per_s": float(np.median(a[:, 1])), "speed_check_blocks": float(len(a))}
