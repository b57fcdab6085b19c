"""Estimators from per-iteration counts: numpy only, so the analysis can use them without torch.

``speclab.decoding.acceptance`` re-exports both names; the cost model (``speclab.costs.cost_model``) is numpy and
scipy only as well.
"""
from __future__ import annotations

import numpy as np


def checked_proposals(accepted, proposed):
    """Proposals the target judged in an iteration: the accepted ones and the first rejection, if any.

    Works on ints and on arrays of per-iteration counts alike.
    """
    return accepted + (accepted < proposed)


def alpha_hat(accepted, proposed) -> float:
    """Acceptance rate from per-iteration counts: accepted / checked proposals.

    A rejection ends the check, so the proposals after it were never judged; counting them as
    failures (accepted / proposed) would make alpha fall with k for the same text and pair.
    This is the maximum-likelihood alpha of the i.i.d. model. Takes sequences or arrays.
    """
    acc = np.asarray(accepted, dtype=float)
    checked = checked_proposals(acc, np.asarray(proposed, dtype=float)).sum()
    return float(acc.sum() / checked) if checked else float("nan")
