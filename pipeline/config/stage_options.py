"""Which option groups (drafter, k policy, sampling) each stage reads, so none is silently ignored.

A job that chooses an option no stage of it reads is refused in one line (it would only rename and rehash
a measurement that does not depend on it). A stage of a multi-stage job (``stage=all``, ``quick``, ``plan``)
that does not read an option the job's other stages read leaves it out of its run name and says so in its
summary (the run's description).
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import FixedKConf, ModelDrafterConf, SamplingConf

GROUPS = {"drafter": ModelDrafterConf, "k_policy": FixedKConf, "sampling": SamplingConf}  # group -> its default
# What each stage part reads. timing: pass times of the two models; divergence: greedy decoding only;
# distribution: the draft model's proposals sampled under the sampling group (do_sample forced on).
USES = {"timing": (), "acceptance": tuple(GROUPS), "speed": tuple(GROUPS), "divergence": ("drafter", "k_policy"),
        "distribution": ("sampling",), "batch": tuple(GROUPS), "plan": tuple(GROUPS),
        "load": tuple(GROUPS)}


def chosen(cfg: DictConfig) -> dict[str, str]:
    """The groups whose values differ from the default option, each as a user would write it."""
    out = {}
    for group, schema in GROUPS.items():
        default = OmegaConf.to_container(OmegaConf.structured(schema))
        mine = OmegaConf.to_container(cfg[group], resolve=True)
        changed = [k for k in {**default, **mine} if mine.get(k) != default.get(k)]
        if "name" in changed:
            out[group] = f"{group}={mine['name']}"
        elif changed:
            out[group] = ", ".join(f"{group}.{k}={mine.get(k)}" for k in changed)
    return out


def uses(part: str) -> tuple[str, ...]:
    """The groups stage ``part`` reads (a name that is no part, e.g. a job's stage option: all of them)."""
    return USES.get(part, tuple(GROUPS))


def unused(cfg: DictConfig, part: str) -> dict[str, str]:
    """The job's chosen options that stage ``part`` does not read."""
    return {g: text for g, text in chosen(cfg).items() if g not in uses(part)}


def check_used(cfg: DictConfig, parts: list[str]) -> None:
    """Refuse an option that no stage of the job reads."""
    for group, text in chosen(cfg).items():
        if not any(group in uses(p) for p in parts):
            readers = [p for p, groups in USES.items() if group in groups]
            reads = ", ".join(dict.fromkeys(g for p in parts for g in uses(p))) or f"none of {list(GROUPS)}"
            raise ValueError(f"{text} is not used by stage={cfg.stage.name} (its stages {parts} read {reads}): "
                             f"leave it out, or run a stage that reads {group}: {', '.join(readers)}")


def unused_note(cfg: DictConfig, part: str) -> list[str]:
    """The summary line of a stage that ignores some of the job's options (none when it reads them all)."""
    left = unused(cfg, part)
    return [f"{part} does not read {'; '.join(left.values())} (left out of this run's name; the job's other "
            f"stages read it)"] if left else []
